"""`lmedge reproduce --paper lyreo` end to end at a CI size: the pipeline runs (tiny
trainings, the grid, the evaluation, the report folder), the report has every part,
and its verdicts agree with the run summaries it wrote.

Tiny: one seed, 3 measured slots a run and no settle slots (so latencies are those
of the requests that finished by then), three methods, two points a sweep,
one-episode trainings of 2 slots, in this process.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from lmedge.bench import lyreo_report
from lmedge.bench.lyreo_repro import LyreoOptions, reproduce, training_unavailable
from lmedge.bench.runner import SequentialExecutor
from lmedge.processes.plugins import register_plugins
from tests.e2e.cli import cli

TINY = LyreoOptions(
    seeds=(1,),
    slots=3,
    policies=("lyreo", "lyreo-nolb", "lyreo-count"),
    episodes=1,
    train_slots=2,
    users=(30, 60),
    servers=(6, 8),
    nus=(0.05, 2.0),
    horizons=(50, 250, 300),
    settle=False,
)
SECTIONS = ("policies", "fig2", "fig3", "table2", "fig4", "fig5", "fig6", "fig7")


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    register_plugins()
    out = tmp_path_factory.mktemp("lyreo-report")
    steps: list[tuple[int, int]] = []
    repro = reproduce(TINY, SequentialExecutor(), lambda n, total, _: steps.append((n, total)))
    assert steps and steps[-1][0] == steps[-1][1]  # the progress reached its total
    lyreo_report.write(out, repro, command="test", cpu_note="cost: test", formats=("png",))
    return out


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def _balance(runs: list[dict[str, Any]], cell: str, policy: str, key: str) -> float:
    return _mean([r["balance"][key] for r in runs if (r["cell"], r["policy"]) == (cell, policy)])


def test_the_report_has_every_section_check_and_figure(report: Path) -> None:
    doc = json.loads((report / "summary.json").read_text())
    assert [s["key"] for s in doc["sections"]] == list(SECTIONS)
    md = (report / "REPORT.md").read_text()
    checks = [c for s in doc["sections"] for c in s["checks"]]
    assert len(checks) >= 20
    for s in doc["sections"]:
        assert f"## {s['title']}" in md
        for f in s["figures"]:
            assert (report / f"{f}.png").is_file()
    for c in checks:
        verdict = {True: "holds", False: "does not hold", None: "not evaluated"}[c["holds"]]
        assert f"| {c['claim']} | {c['ref']} | **{verdict}** |" in md
        assert c["reason"]
    assert set(doc["policies"]) == {"lyreo", "ly-ppo", "ppo-fixed"}
    assert {r["cell"] for r in doc["runs"]} >= {"base", "mix-homogeneous", "users-30", "nu-2"}
    timing = json.loads((report / "timing.json").read_text())
    assert len(timing) == len(doc["runs"]) + len(doc["trainings"])


def test_the_verdicts_are_those_of_the_written_numbers(report: Path) -> None:
    doc = json.loads((report / "summary.json").read_text())
    runs = doc["runs"]
    checks = {c["claim"]: c for s in doc["sections"] for c in s["checks"]}
    lat = "mean_latency_s"
    faster = _balance(runs, "base", "lyreo-nolb", lat) < _balance(runs, "base", "lyreo", lat)
    assert checks["NoLB lowers the mean latency"]["holds"] is faster
    dev = "mean_deviation"
    rises = all(
        _balance(runs, "mix-homogeneous", p, dev)
        < _balance(runs, "base", p, dev)
        < _balance(runs, "mix-heterogeneous", p, dev)
        for p in TINY.policies or ()
    )
    claim = "deviation rises from homogeneous to moderate to heterogeneous for every method"
    assert checks[claim]["holds"] is rises
    falls = _balance(runs, "nu-2", "lyreo", lat) < _balance(runs, "nu-0.05", "lyreo", lat)
    assert checks["latency falls as ν goes from 0.05 to 2"]["holds"] is falls


def test_the_convergence_curves_come_from_the_trainings(report: Path) -> None:
    doc = json.loads((report / "summary.json").read_text())
    fig2 = next(s for s in doc["sections"] if s["key"] == "fig2")
    if training_unavailable():
        assert doc["trainings"] == {}
        assert all(c["holds"] is None for c in fig2["checks"])
        return
    assert set(doc["trainings"]) == {"fig2-lyreo", "h-50", "h-300"}  # H 250 is fig2's
    curve = doc["trainings"]["fig2-lyreo"]
    assert [e["episode"] for e in curve] == [0]
    (row,) = [r for r in fig2["tables"][0]["rows"] if r[0] == "LYREO"]
    assert row[2] == f"{curve[0]['mean_latency_s']:.2f}"


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--paper", "nosuch"], "--paper must be one of ma, lyreo, cema, got 'nosuch'"),
        (["--paper", "lyreo", "--policies", "lyreo,nosuch"], "nosuch"),
        (["--paper", "lyreo", "--seeds", "1,1"], "--seeds names a seed twice"),
    ],
    ids=["unknown-paper", "unknown-policy", "seed-twice"],
)
def test_bad_flags_get_one_line_and_exit_2(
    flags: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = cli(["reproduce", "-o", str(tmp_path / "r"), *flags], capsys)
    assert code == 2
    assert message in err
    assert len(err.strip().splitlines()) == 1
    assert out == ""
