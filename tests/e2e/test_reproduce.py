"""`lmedge reproduce` end to end: the pool gives the sequential results, the report is
complete, and bad flags get one line and exit code 2.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lmedge.bench.grid import Options, plan, specs
from lmedge.bench.runner import ProcessPoolRunExecutor, SequentialExecutor
from lmedge.processes.plugins import register_plugins
from tests.e2e.cli import cli

ROOT = Path(__file__).resolve().parents[2]


def test_a_process_pool_returns_exactly_the_sequential_results() -> None:
    grid = plan(Options(seeds=(1, 2), slots=4, policies=("ma", "perllm", "rr")))
    runs = [s for s in specs(grid) if s.scenario.name in {"testbed", "bursty"}]
    runs = [s for s in runs if s.scenario.name == "testbed"] + runs[:1]
    finished: list[int] = []
    pooled = ProcessPoolRunExecutor(2, setup=register_plugins).map(
        runs, lambda i, _: finished.append(i)
    )
    alone = SequentialExecutor().map(runs)
    assert sorted(finished) == list(range(len(runs)))
    assert [r.spec for r in pooled] == runs  # in spec order, whatever finished first
    for a, b in zip(pooled, alone, strict=True):
        assert json.dumps(a.summary, sort_keys=True) == json.dumps(b.summary, sort_keys=True)
        assert a.requests == b.requests
        assert len(a.requests) > 0
    # different seeds really are different traces (the comparison above is not vacuous)
    assert pooled[0].requests != pooled[1].requests


def test_an_out_folder_that_cannot_be_created_fails_before_any_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    taken = tmp_path / "a-file"
    taken.write_text("not a folder")
    code, out, err = cli(["reproduce", "--quick", "-o", str(taken / "report")], capsys)
    assert code == 2
    assert err.startswith(f"error: --out {taken / 'report'}: cannot create the report folder")
    assert len(err.strip().splitlines()) == 1
    assert out == ""  # no run started: nothing was printed


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--policies", "ma,nosuch"], "nosuch"),
        (["--slots", "-5"], "--slots must be at least 1, got -5"),
        (["--slots", "0"], "--slots must be at least 1, got 0"),
        (["--seeds", "1,x"], "--seeds must be comma-separated integers, got '1,x'"),
        (["--seeds", "-1"], "--seeds must be non-negative, got -1"),
        (["--seeds", ","], "--seeds names no seed"),
        (["--workers", "0"], "--workers must be at least 1, got 0"),
    ],
    ids=[
        "unknown-policy",
        "negative-slots",
        "zero-slots",
        "bad-seeds",
        "negative-seed",
        "no-seed",
        "zero-workers",
    ],
)
def test_bad_flags_get_one_line_and_exit_2(
    flags: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = cli(["reproduce", "-o", str(tmp_path / "r"), *flags], capsys)
    assert code == 2
    assert message in err
    assert len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err
    assert not (tmp_path / "r").exists()  # nothing ran, nothing written


@pytest.mark.slow
def test_quick_reproduce_writes_the_whole_report(tmp_path: Path) -> None:
    out = tmp_path / "report"
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "from lmedge.cli import main; main()",
            "reproduce",
            "--quick",
            "--slots",
            "6",
            "--policies",
            "ma,mal,perllm,milp,rf",
            "--workers",
            "2",
            "-o",
            str(out),
        ],
        cwd=tmp_path,
        env={**os.environ},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    for heading in ("Fig. 6", "Fig. 7", "Fig. 8", "Fig. 9", "Table II", "Table III", "Table IV"):
        assert heading in proc.stdout
    assert "Latency reduction of MA vs each method" in proc.stdout
    assert "holds" in proc.stdout
    report = (out / "REPORT.md").read_text()
    assert "| MA | 96.7 |" in report  # the paper's value beside lmedge's
    for fig in ("fig6-testbed", "fig7-testbed", "fig8-testbed", "fig9-bursty"):
        assert (out / f"{fig}.png").stat().st_size > 10_000
        assert (out / f"{fig}.svg").read_text().lstrip().startswith("<?xml")
        assert f"]({fig}.png)" in report
    summary = json.loads((out / "summary.json").read_text())
    assert {s["key"] for s in summary["sections"]} == {
        "fig6",
        "fig7",
        "fig8",
        "fig9",
        "table2",
        "table3",
        "table4",
        "targets",
    }
    assert len(summary["runs"]) == 5 + 3 + 3
    assert {(r["scenario"], r["slots"]) for r in summary["runs"]} == {
        ("testbed", 6),
        ("testbed-expanded", 6),
        ("bursty", 18),
    }
    timing = json.loads((out / "timing.json").read_text())
    assert all(t["cpu_s"] > 0 for t in timing)
