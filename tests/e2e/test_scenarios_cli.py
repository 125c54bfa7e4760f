"""`lmedge scenarios generate` and `lmedge bench --generated` from the command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.cli import cli


def test_generate_writes_the_same_bytes_for_the_same_seed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("a", "b"):
        code, _, err = cli(
            ["scenarios", "generate", "--seed", "5", "-o", str(tmp_path / name)], capsys
        )
        assert code == 0 and "wrote" in err
    files = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert {"nodes.yaml", "services.yaml", "scenario.yaml", "generated.yaml"} <= set(files)
    for f in files:
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes()


def test_generate_help_lists_the_distributions(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = cli(["scenarios", "generate", "--help"], capsys)
    assert code == 0 and "U{1..8}" in out and "backhaul" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["bench", "--generated", "1", "-f", "testbed"], "--generated draws its own scenarios"),
        (["bench", "--generated", "0"], "--generated"),
        (
            ["scenarios", "generate", "--seed", "1", "--min-workers", "9", "--max-workers", "4"],
            "workers",
        ),
    ],
    ids=["with-scenario", "zero", "workers-reversed"],
)
def test_mistakes_are_one_line(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = cli(args, capsys)
    assert code == 2
    assert message in err and len(err.strip().splitlines()) == 1


def test_robustness_bench_writes_markdown_and_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "rb"
    args = ["bench", "--generated", "1", "--from", "3", "--policies", "rr,rf", "--slots", "2"]
    code, stdout, _ = cli([*args, "--workers", "1", "-o", str(out)], capsys)
    assert code == 0
    payload = json.loads((out / "robustness.json").read_text())
    assert payload["cases"] == 1 and set(payload["profiles"]) == {"rr", "rf"}
    assert (out / "scenarios" / "gen-3" / "generated.yaml").is_file()
    assert "| rr |" in stdout and (out / "robustness.md").read_text().startswith("# Robustness")
