"""`lmedge calibration-check` end to end on short runs: a report, exit 0; bad input exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lmedge.bench.calibration import FACTS
from tests.e2e.cli import cli

ROOT = Path(__file__).resolve().parents[2]
TESTBED = ROOT / "examples" / "testbed"
SHORT = ["--seeds", "1", "--slots", "4", "--pre-slots", "2"]


def test_json_report_has_every_fact_with_paper_value_and_distance(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = cli(
        ["calibration-check", "-f", str(TESTBED), *SHORT, "--workers", "1", "--json"], capsys
    )
    assert code == 0, err
    report = json.loads(out)
    assert report["seeds"] == [1]
    assert report["runs"]["pre"] == {"policy": "ma", "slots": 2}
    assert report["runs"]["milp"] == {"policy": "milp", "slots": 4}
    rows = {r["key"]: r for r in report["facts"]}
    assert list(rows) == [f.key for f in FACTS]
    for r in rows.values():
        assert r["paper"] is not None
        if r["lmedge"] is not None:
            assert r["delta"] == pytest.approx(r["lmedge"] - r["paper"])
    # The testbed has the paper's four LMs, so every fact is measured.
    assert all(r["lmedge"] is not None for r in rows.values())
    assert rows["pre.median_latency"]["paper"] == 9.76
    assert rows["static.lm2_over_lm1_gpu"]["holds"] is True


def test_pool_gives_the_same_report_as_one_process(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["calibration-check", "-f", str(TESTBED), *SHORT, "--json"]
    code1, one, _ = cli([*base, "--workers", "1"], capsys)
    code2, two, _ = cli([*base, "--workers", "2"], capsys)
    assert code1 == code2 == 0
    assert json.loads(one) == json.loads(two)


def test_table_names_the_paper_and_lmedge(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    report = tmp_path / "check.json"
    code, out, err = cli(
        ["calibration-check", "-f", "testbed", *SHORT, "--workers", "1", "--out", str(report)],
        capsys,
    )
    assert code == 0, err
    # --out keeps the JSON report beside the printed table.
    assert [r["key"] for r in json.loads(report.read_text())["facts"]] == [f.key for f in FACTS]
    assert "paper" in out and "lmedge" in out and "median" in out and "LM-mean" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--seeds", "one"], "--seeds must be comma-separated integers"),
        (["--pre-policy", "nope"], "unknown policy 'nope'"),
        (["-f", "no-such-scenario"], "not found"),
        (["--slots", "0"], "must be at least 1"),
        (["--out", "/nonexistent-dir/check.json"], "cannot write --out"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = cli(["calibration-check", *SHORT, *args], capsys)
    assert code == 2
    assert message in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
