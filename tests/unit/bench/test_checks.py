"""The check helpers of `lmedge reproduce`: every verdict comes with the numbers behind it."""

from __future__ import annotations

import pytest

from lmedge.bench.checks import chain_check, extreme_check, reduction


@pytest.mark.parametrize(
    ("values", "lowest", "holds", "reason"),
    [
        ({"ma": 90.0, "mal": 120.0, "rf": 400.0}, True, True, "MA 90.0; next MAL 120.0"),
        ({"ma": 130.0, "mal": 120.0, "rf": 400.0}, True, False, "MA 130.0, but MAL 120.0 (lower)"),
        ({"ma": 500.0, "mal": 120.0, "rf": 400.0}, False, True, "MA 500.0; next RF 400.0"),
        ({"ma": 120.0, "mal": 120.0, "rf": 400.0}, True, False, "MA 120.0 ties with MAL"),
        ({"ma": None, "mal": 120.0}, True, None, "MA: no value (nothing of that kind occurred)"),
        ({"mal": 120.0, "rf": 1.0}, True, None, "MA: not run"),
        ({"ma": 1.0}, True, None, "MA 1.0: no rival measured"),
    ],
    ids=["lowest", "not-lowest", "highest", "tie", "no-value", "not-run", "alone"],
)
def test_extreme_check(
    values: dict[str, float | None], lowest: bool, holds: bool | None, reason: str
) -> None:
    c = extreme_check("claim", "§VI", values, "ma", lowest=lowest)
    assert (c.holds, c.reason) == (holds, reason)


def test_chain_check_names_the_first_broken_link() -> None:
    values: dict[str, float | None] = {"ma": 90.0, "mal": 150.0, "perllm": 120.0, "milp": 200.0}
    c = chain_check("chain", "§VI", values, ("ma", "mal", "perllm", "milp"))
    assert c.holds is False
    assert c.reason.endswith("MAL is not below PerLLM")
    values["perllm"] = 160.0
    assert chain_check("chain", "§VI", values, ("ma", "mal", "perllm", "milp")).holds is True
    values["milp"] = None
    missing = chain_check("chain", "§VI", values, ("ma", "mal", "perllm", "milp"))
    assert (missing.holds, missing.reason) == (None, "not measured: MILP")


def test_reduction() -> None:
    # the paper's own arithmetic: MA 96.7 s vs PerLLM 169.3 s is a 42.9% reduction
    assert reduction(96.7, 169.3) == pytest.approx(0.429, abs=5e-4)
    assert reduction(200.0, 100.0) == pytest.approx(-1.0)
    assert reduction(None, 100.0) is None
    assert reduction(10.0, 0.0) is None
