"""`lmedge reproduce --paper cema`: verdicts follow the numbers, and the pipeline end to end."""

from __future__ import annotations

from pathlib import Path

import pytest

from lmedge.bench import cema_repro
from lmedge.bench.cema_repro import (
    CemaOptions,
    deploy_j,
    greedy_check,
    outcome_terms,
    reproduce_cema,
    tradeoff_checks,
    write,
)
from lmedge.bench.runner import SequentialExecutor
from lmedge.policies.cema.quality import rag_available
from lmedge.processes.plugins import register_plugins

needs_cema = pytest.mark.skipif(rag_available() is not None, reason=str(rag_available()))


@pytest.mark.parametrize(
    ("j", "holds"),
    [
        ({"cema": 0.40, "independent": 0.45, "seed": 0.50}, True),
        ({"cema": 0.40, "independent": 0.38, "seed": 0.50}, False),
        ({"cema": 0.40, "independent": 0.45, "seed": 0.40}, False),
    ],
    ids=["cema-wins", "independent-wins", "tie-with-seed-is-no-win"],
)
def test_the_greedy_check_compares_cema_with_both_greedies(
    j: dict[str, float], holds: bool
) -> None:
    check = greedy_check(j)
    assert check.holds is holds
    assert f"{j['cema']:.3f}" in check.reason
    assert ("greedy wins" in check.reason) is (not holds)  # a loss says why


def test_the_tradeoff_checks_read_each_term() -> None:
    cema = {"cost": 1.0, "energy": 5.0, "makespan": 2.0, "quality_loss": 0.5}
    uni = {"cost": 2.0, "energy": 4.0, "makespan": 3.0, "quality_loss": 0.3}
    verdicts = [c.holds for c in tradeoff_checks(cema, uni, "Table V")]
    assert verdicts == [True, False, True, True]


def test_deployment_j_normalizes_each_term_by_the_largest_method() -> None:
    terms: dict[str, dict[str, float | None]] = {
        "a": {"q": 0.5, "e": 100.0, "t": 10.0},
        "b": {"q": 0.25, "e": 200.0, "t": 5.0},
        "c": {"q": None, "e": 1.0, "t": 1.0},
    }
    j = deploy_j(terms)
    assert j["a"] == pytest.approx(0.25 * (1.0 + 0.5 + 1.0))
    assert j["b"] == pytest.approx(0.25 * (0.5 + 1.0 + 0.5))
    assert j["c"] is None


@pytest.mark.parametrize(
    ("success", "e", "e_request"),
    [(1.0, 100.0, 100.0), (0.1, 1000.0, 100.0), (0.0, None, 100.0)],
    ids=["all-served", "most-time-out", "none-served"],
)
def test_deployment_energy_is_per_served_request(
    success: float, e: float | None, e_request: float
) -> None:
    # the same joules over 200 requests: a method answering a tenth of them pays 10x each
    summary = {
        "requests": 200,
        "success_ratio": success,
        "routing": {"energy_j": 20_000.0, "energy_j_per_request": 100.0},
        "tokens": {"per_lm": []},
    }
    terms = outcome_terms(summary, "arithmetic")
    assert terms["e"] == (None if e is None else pytest.approx(e))
    assert terms["e_request"] == e_request


@needs_cema
def test_the_pipeline_end_to_end_on_a_tiny_grid(tmp_path: Path) -> None:
    register_plugins()
    seen: list[str] = []
    repro = reproduce_cema(
        CemaOptions(seeds=(1,), slots=3, batches=2, quick=True),
        SequentialExecutor(),
        lambda n, total, what: seen.append(what),
    )
    keys = [s.key for s in repro.sections]
    assert keys == ["table5", "fig2", "fig7", "table7", "tuning", "deploy"]
    assert len(seen) == len(repro.runs) + 4
    assert {cema_repro._method(r) for r in repro.runs} == set(cema_repro.QUICK_DEPLOY)
    for s in repro.sections:
        assert s.tables and s.checks
        for c in s.checks:
            assert c.holds in (True, False, None) and c.reason
    # verdicts come from the numbers: recompute two from the raw results
    t5 = repro.controlled["table5"][2]
    fig2 = next(s for s in repro.sections if s.key == "fig2").checks[0]
    assert fig2.holds is (t5["independent"]["makespan"] >= 1.5 * t5["cema"]["makespan"])
    five = repro.controlled["table5"][5]  # the first check: Table V's 5 batches
    lowest = next(s for s in repro.sections if s.key == "table5").checks[0]
    assert lowest.holds is (min(five, key=lambda k: five[k]["j"]) == "cema")
    deploy = next(s for s in repro.sections if s.key == "deploy")
    assert all(c.holds is not None for c in deploy.checks)  # CEMA and UniRoute ran
    md = write(tmp_path, repro, command="lmedge reproduce --paper cema --quick", note="n")
    text = md.read_text()
    held = sum(1 for s in repro.sections for c in s.checks if c.holds)
    total = sum(len(s.checks) for s in repro.sections)
    assert f"## The orderings: {held} of {total} hold" in text
    assert (tmp_path / "summary.json").is_file()
