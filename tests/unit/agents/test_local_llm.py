"""The bundled self-hosted LLM's command lines (lmedge.agents.local_llm): pure logic."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
from typer.main import get_command

from lmedge.agents.local_llm import (
    EMULATOR_PARAMS,
    MODEL_ALIAS,
    main,
    server_command,
    simulate_argv,
)
from lmedge.cli import simulate


def test_simulate_argv_points_every_agentic_tier_at_the_server() -> None:
    argv = simulate_argv("http://127.0.0.1:9/v1", ["--slots", "2"])
    assert argv[:4] == ["lmedge", "simulate", "--policy", "ma"]
    assert argv[argv.index("--llm-base-url") + 1] == "http://127.0.0.1:9/v1"
    assert argv[argv.index("--llm-model") + 1] == MODEL_ALIAS
    for tier in ("planner", "router", "deployer"):
        given = [argv[i + 1] for i, a in enumerate(argv) if a == f"--{tier}-param"]
        assert given == [f"{k}={v}" for k, v in EMULATOR_PARAMS.items()]
    assert argv[-2:] == ["--slots", "2"]  # the user's arguments last: theirs win


@pytest.mark.parametrize("policy", [["--policy", "mal"], ["-p", "mal"], ["--policy=mal"]])
def test_a_policy_given_is_not_overridden(policy: list[str]) -> None:
    argv = simulate_argv("http://h/v1", policy)
    assert argv.count("ma") == 0
    assert argv[-len(policy) :] == policy


def test_simulate_argv_parses_with_the_real_cli() -> None:
    # The option names must be the simulate command's: click resolves every one
    # (an unknown option or a missing value raises here).
    app = typer.Typer()
    app.callback()(lambda: None)
    simulate.register(app)
    command = get_command(app).commands["simulate"]  # type: ignore[attr-defined]
    argv = simulate_argv("http://127.0.0.1:9/v1", ["--slots", "1", "--no-settle"])
    assert argv[:2] == ["lmedge", "simulate"]
    sub_ctx = command.make_context("simulate", argv[2:])
    assert sub_ctx.params["llm_base_url"] == "http://127.0.0.1:9/v1"
    assert sub_ctx.params["policy"] == "ma"
    assert sub_ctx.params["settle"] is False
    assert "llm_slot_cap=off" in sub_ctx.params["router_param"]


def test_server_command_serves_the_model_under_its_alias(tmp_path: Path) -> None:
    cmd = server_command(tmp_path / "m.gguf", 1234, 3)
    assert cmd[1:3] == ["-m", "llama_cpp.server"]
    pairs = dict(zip(cmd[3::2], cmd[4::2], strict=True))
    assert pairs["--model"] == str(tmp_path / "m.gguf")
    assert pairs["--model_alias"] == MODEL_ALIAS
    assert pairs["--chat_format"] == "chatml"  # keeps the system message
    assert pairs["--port"] == "1234"
    assert pairs["--n_threads"] == pairs["--n_threads_batch"] == "3"
    assert pairs["--host"] == "127.0.0.1"


def test_a_missing_model_is_a_one_line_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("LMEDGE_TOOLS_DIR", str(tmp_path / "tools"))
    monkeypatch.setenv("LMEDGE_LLAMA_LOG_DIR", str(tmp_path / "logs"))
    assert main(["--slots", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: no GGUF model at ")
    assert "make tools" in err
    assert len(err.splitlines()) == 1
