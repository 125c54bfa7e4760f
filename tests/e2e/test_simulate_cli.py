"""`lmedge simulate`, `bench` and `demo` end to end, and their answers to bad input.

Bad input must give one line on stderr naming the problem (file and field
for manifests) and exit code 2, never a traceback. The JSON output must be
byte-identical for the same seed, in separate processes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.cli import cli

ROOT = Path(__file__).resolve().parents[2]
TESTBED = ROOT / "examples" / "testbed"


def lmedge(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "LMEDGE_STORE": str(cwd / "store")}
    return subprocess.run(
        [sys.executable, "-c", "from lmedge.cli import main; main()", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture
def scenario(tmp_path: Path) -> Path:
    """A writable copy of the testbed, for breaking on purpose."""
    dest = tmp_path / "testbed"
    shutil.copytree(TESTBED, dest)
    return dest


def test_same_seed_gives_byte_identical_json(tmp_path: Path) -> None:
    args = ("simulate", "-f", str(TESTBED), "--policy", "rr", "--slots", "20", "--seed", "3")
    first = lmedge(*args, "--json", "--no-store", cwd=tmp_path)
    second = lmedge(*args, "--json", cwd=tmp_path)  # storing must not change the numbers
    assert first.returncode == 0, first.stderr
    assert second.returncode == 0, second.stderr
    assert first.stdout == second.stdout
    summary = json.loads(first.stdout)
    for key in ("objective", "jain", "f_norm", "t_norm", "mean_latency_s", "success_ratio"):
        assert key in summary
    assert [x["lm"] for x in summary["per_lm"]] == ["lm1", "lm2", "lm3", "lm4"]
    assert "timing" not in summary
    assert (tmp_path / "store").is_dir()


def test_table_output_and_overrides(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, err = cli(
        [
            "simulate",
            "-f",
            "testbed",
            "--policy",
            "rf",
            "--router",
            "local",
            "--slots",
            "5",
            "--no-store",
            "--no-settle",
            "--keep-history",
        ],
        capsys,
    )
    assert code == 0, err
    assert "rf[static/local/full]" in out
    for label in (
        "at τ (s)",
        "success ratio",
        "Jain",
        "F_norm",
        "T_norm",
        "objective",
        "conflict ratio",
        "activations / 100",
        "decision time per slot",
    ):
        assert label in out


def test_json_timings_flag_adds_a_separate_key(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = cli(
        ["simulate", "--slots", "3", "--no-store", "--no-settle", "--json", "--timings"], capsys
    )
    assert code == 0
    timing = json.loads(out)["timing"]
    assert timing["slots_run"] == 3 and timing["run_id"].startswith("testbed-ma-s1-")


def test_simulate_says_what_it_runs_beyond_the_measured_slots(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, _, err = cli(["simulate", "--slots", "2", "--no-store", "--json"], capsys)
    assert code == 0, err
    # the rule-backed `ma` planner reads no baseline, so none is run for it
    assert (
        "warm-up: 31 settling slots, no random baseline (the planner reads none); "
        "--no-settle / --warmup K to change\n"
    ) in err


def _break(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))


@pytest.mark.parametrize(
    ("breakage", "expected"),
    [
        (
            ("services.yaml", "deploymentMemoryGib: 9", "deploymentMemoryGib: lots"),
            "services.yaml: document 2: LMService/lm2.spec.deploymentMemoryGib: ",
        ),
        (
            ("nodes.yaml", "  cpuCores: 24", "  cpuCores: 24\n  cpuCorez: 24"),
            "nodes.yaml: document 2: EdgeNode/worker-1.spec.cpuCorez: unknown field",
        ),
        (
            ("services.yaml", "deploymentMemoryGib: 3.5", "deploymentMemoryGib: 300"),
            "services.yaml: LMService lm4 fits on no node",
        ),
        (
            ("scenario.yaml", "  slotS: 30", "  slotS: -30"),
            "scenario.yaml: Scenario.loop.slotS: ",
        ),
    ],
    ids=["malformed-value", "unknown-field", "infeasible", "bad-scenario-field"],
)
def test_bad_scenarios_give_one_line_and_exit_2(
    scenario: Path,
    capsys: pytest.CaptureFixture[str],
    breakage: tuple[str, str, str],
    expected: str,
) -> None:
    file, old, new = breakage
    _break(scenario / file, old, new)
    code, out, err = cli(["simulate", "-f", str(scenario), "--slots", "5", "--no-store"], capsys)
    assert code == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert expected in lines[0]
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["simulate", "--policy", "nope"], "unknown policy 'nope'; known policies: "),
        (["simulate", "--deployer", "nope"], "unknown deployer 'nope'"),
        (["simulate", "--slots", "-5"], "--slots must be at least 1, got -5"),
        (["simulate", "-f", "no/such/place"], "scenario 'no/such/place' not found"),
        (
            ["simulate", "--warmup", "51"],
            "--warmup must be between 0 and the scenario's epoch (50 slots), got 51",
        ),
        (["simulate", "--store", "ftp://x"], "unsupported store URI scheme 'ftp'"),
        (["bench", "--policies", "rr,nope"], "unknown policy 'nope'"),
        (["bench", "--seeds", "1,x"], "--seeds must be comma-separated integers"),
        (["bench", "--slots", "0"], "--slots must be at least 1, got 0"),
    ],
    ids=[
        "policy",
        "deployer",
        "slots",
        "scenario",
        "warmup",
        "store",
        "bench-policy",
        "seeds",
        "bench-slots",
    ],
)
def test_bad_flags_give_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], args: list[str], expected: str
) -> None:
    code, _, err = cli([*args, "--no-store"] if args[0] == "simulate" else args, capsys)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert expected in lines[0]


def test_bench_writes_a_report_for_two_scenarios(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, scenario: Path
) -> None:
    out_dir = tmp_path / "report"
    code, out, err = cli(
        [
            "bench",
            "-f",
            "testbed",
            "-f",
            str(scenario),
            "--policies",
            "rr,rf",
            "--slots",
            "10",
            "--seeds",
            "1,2",
            "--out",
            str(out_dir),
        ],
        capsys,
    )
    assert code == 0, err
    assert f"report: {out_dir / 'summary.md'}" in out.replace("\n", "")
    data = json.loads((out_dir / "summary.json").read_text())
    assert len(data["runs"]) == 2 * 2 * 2
    assert set(data["scenarios"]["testbed"]) == {"rr", "rf"}
    md = (out_dir / "summary.md").read_text()
    for heading in ("Inactive-target conflicts", "Reconfiguration", "Per LM", "Decision audit"):
        assert heading in md
    # The summary table is printed too: one row per policy with the report's means.
    for policy in ("rr", "rf"):
        row = data["scenarios"]["testbed"][policy]
        line = next(x for x in out.splitlines() if f"│ {policy} " in x)
        assert f"{row['objective']:.3f}" in line and f"{row['success_ratio']:.3f}" in line
    for fig in ("fig6", "fig7", "fig9"):
        png = out_dir / f"{fig}-testbed.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out_dir / "timing.json").exists()


def test_demo_runs_end_to_end(tmp_path: Path) -> None:
    result = lmedge("demo", "--slots", "20", "--out", str(tmp_path / "demo"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert f"report: {tmp_path / 'demo' / 'summary.md'}" in result.stdout.replace("\n", "")
    assert "lmedge decisions --store" in result.stdout and "--agent planner" in result.stdout
    last = result.stdout.strip().splitlines()[-1]
    assert last.startswith("see it in a browser: ") and " dashboard --store " in last
    assert (tmp_path / "demo" / "summary.md").exists()
    assert (tmp_path / "store").is_dir()
