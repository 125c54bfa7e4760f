"""`lmedge simulate --router-param admit_fraction=...`: admission control end to end."""

from __future__ import annotations

import json

import pytest

from tests.e2e.cli import cli


def test_admission_on_rejects_and_reports_it(capsys: pytest.CaptureFixture[str]) -> None:
    # 60 slots: enough for LM4's queues to grow past a short horizon
    args = ["simulate", "-p", "ma", "--slots", "60", "--no-store", "--json"]
    code, out, err = cli([*args, "--router-param", "admit_fraction=0.15"], capsys)
    assert code == 0, err
    s = json.loads(out)
    assert s["rejected"] > 0
    assert s["rejected_ratio"] == pytest.approx(s["rejected"] / s["requests"], abs=1e-6)
    assert sum(x["rejected"] for x in s["per_lm"]) == s["rejected"]
    assert sum(w["rejected"] for w in s["windows"]) == s["rejected"]
    assert s["successes"] + s["rejected"] <= s["requests"], "a rejection is never a success"
    code, out, err = cli([*args, "--router-param", "admit_fraction=off"], capsys)
    assert code == 0, err
    assert json.loads(out)["rejected"] == 0, "off admits every set"


@pytest.mark.parametrize(
    ("param", "message"),
    [
        ("admit_fraction", "--router-param takes KEY=VALUE, got 'admit_fraction'"),
        ("admit_fraction=2", "admit_fraction: must be in (0, 1] or off"),
        ("bogus=1", "bogus: Extra inputs are not permitted"),
    ],
    ids=["no-value", "out-of-range", "unknown-key"],
)
def test_bad_router_param_is_one_line(
    param: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = cli(
        ["simulate", "-p", "ma", "--slots", "1", "--no-store", "--router-param", param], capsys
    )
    assert code == 2
    assert message in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
