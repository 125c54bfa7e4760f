"""`lmedge calibrate --engine llama.cpp` end to end on a real llama-server, a few requests.

The binary comes from `make tools` (tools/build-llama-server.sh), the model
from tools/build-llama.sh; without them the test skips with the command to
run, or fails where `LMEDGE_REQUIRE_TOOLS=1` (CI). It checks the pipeline, not
the accuracy: the profile is a valid `spec.engine`, every trace request was
served with its exact lengths, and the comparison has its fields. The
accuracy target is benchmarks/test_engine_calibration_bench.py's.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import typer
import yaml
from typer.testing import CliRunner

from lmedge.agents.local_llm import model_path
from lmedge.api.engines import EngineSpec
from lmedge.bench.engine_calibration import LOADS, METRICS
from lmedge.bench.llama_server import binary_path, missing_reason
from lmedge.cli.calibrate import register

pytestmark = pytest.mark.slow


def test_calibrate_engine_writes_a_profile_and_the_comparison(tmp_path: Path) -> None:
    if why := missing_reason(binary_path(), model_path()):
        if os.environ.get("LMEDGE_REQUIRE_TOOLS", "") not in ("", "0", "false"):
            pytest.fail(why)
        pytest.skip(why)
    out = tmp_path / "cal"
    # the command alone on its own app (a one-command typer app takes no command name)
    argv = [
        "--engine",
        "llama.cpp",
        "--requests",
        "6",
        "--parallel",
        "2",
        "--seed",
        "2",
        "-o",
    ]
    app = typer.Typer()
    register(app)
    res = CliRunner().invoke(app, [*argv, str(out)])
    assert res.exit_code == 0, res.output
    engine = EngineSpec.model_validate(yaml.safe_load((out / "engine.yaml").read_text())["engine"])
    assert engine.kind == "llama.cpp" and engine.tokens is not None
    cpu = engine.tokens.cpu
    assert cpu is not None and [p.running for p in cpu.decode] == [1, 2]
    assert engine.tokens.max_running_sequences == 2
    comparison = json.loads((out / "comparison.json").read_text())
    assert comparison["clock"] == "cpu"
    assert len(comparison["iteration_s"]) == 2  # t(k) at k = 1, 2
    assert [rep["load"] for rep in comparison["replays"]] == list(LOADS)
    for rep in comparison["replays"]:
        assert [e["metric"] for e in rep["errors"]] == list(METRICS)
        for e in rep["errors"]:
            assert {"median", "p90", "requests", "meets_target"} <= set(e)
            assert e["median"] >= 0 and e["p90"] >= e["median"]
        assert len(rep["requests"]) == 6
        # emulated at the level re-timed just before it, on every running count
        assert rep["level"]["prefill"] > 0 and rep["level"]["decode"] > 0
        assert {k for k, _ in rep["retiming"]["decode"]} == {1, 2}
        assert len(rep["retiming"]["prefill"]) > 0
        for r in rep["requests"]:
            assert r["measured"]["e2e"] >= r["measured"]["ttft"] > 0
            # the stages sum to the end-to-end latency, from the planned arrival
            st = r["measured_stages"]
            total = st["send"] + st["wait"] + st["prefill"] + st["decode"]
            assert total == pytest.approx(r["measured"]["e2e"])
            assert st["send"] >= 0 and st["wait"] >= 0 and st["prefill"] > 0
    assert len(comparison["burst"]["requests"]) == 12  # 6 per slot
    table = (out / "comparison.md").read_text()
    assert all(f"| {m.upper()} |" in table for m in METRICS)
    assert "Where the sustained burst's time went" in table
