"""The grid of `lmedge reproduce` and its evaluation against the paper's orderings.

The evaluation is checked on synthetic run summaries built from the paper's
own published numbers: those must satisfy every ordering the paper states
(else a check has its direction or its data wrong), and changing one number
must flip exactly the check that depends on it.
"""

from __future__ import annotations

import pytest

from lmedge.bench import paper
from lmedge.bench.evaluation import evaluate
from lmedge.bench.grid import QUICK_SLOTS, Experiment, Options, plan, specs
from lmedge.bench.runner import RequestTable, RunData, RunSpec, resolve_scenario
from lmedge.controller.assembly import PolicyChoice
from lmedge.errors import ConfigError

# Latencies the paper does not print (RR, AL): placed where its text puts them.
UNPRINTED = {"rr": paper.Headline(300.0, None), "al": paper.Headline(240.0, 0.95)}


def test_the_paper_numbers_are_transcribed_consistently() -> None:
    ma = paper.FIG6["ma"].latency_s
    for other, published in paper.REDUCTIONS.items():
        theirs = paper.FIG6[other].latency_s
        assert ma is not None and theirs is not None
        assert 1 - ma / theirs == pytest.approx(published, abs=6e-4), other
    milp = [paper.FIG7["milp"][lm].latency_s or 0.0 for lm in paper.LMS]
    assert sum(milp) / 4 == pytest.approx(paper.FIG6["milp"].latency_s, abs=0.3)
    assert sum(r.activations_per_100 for r in paper.TABLE3.values()) == pytest.approx(
        paper.TABLE3_ALL.activations_per_100, abs=0.02
    )


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (Options(seeds=(1, -2)), "--seeds must be non-negative integers, got -2"),
        (Options(seeds=(1, 1)), "--seeds names a seed twice"),
        (Options(seeds=()), "--seeds names no seed"),
        (Options(slots=0), "--slots must be at least 1, got 0"),
        (Options(policies=()), "--policies names no policy"),
        (Options(policies=("ma", "nosuch")), "nosuch"),
    ],
    ids=["negative-seed", "duplicate-seed", "no-seed", "zero-slots", "no-policy", "unknown-policy"],
)
def test_bad_options_are_refused_before_any_run(options: Options, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        plan(options)


def test_the_full_grid_covers_every_result() -> None:
    grid = {e.scenario: e for e in plan(Options())}
    assert grid["testbed"].policies == (*paper.METHODS, *paper.EXTRAS)
    assert grid["testbed-expanded"].policies == ("ma", "mal", "perllm")
    bursty = grid["bursty"]
    assert bursty.slots == 600
    assert [p[0] for p in bursty.phases] == ["balanced", "lm3-burst", "lm1-lm4-burst"]
    assert [p[1:] for p in bursty.phases] == [(0, 200), (200, 400), (400, 600)]
    runs = specs(list(grid.values()))
    assert len(runs) == 3 * (11 + 3 + 3)
    assert runs[0].slots * 3 >= runs[-1].slots  # longest (milp: 3x per slot) first
    assert runs[-1].slots == 200


def test_quick_is_one_seed_short_runs_and_the_paper_methods_only() -> None:
    grid = {e.scenario: e for e in plan(Options(seeds=(4, 5), quick=True))}
    assert grid["testbed"].seeds == (1,)
    assert grid["testbed"].slots == QUICK_SLOTS
    assert grid["testbed"].policies == paper.METHODS
    assert grid["bursty"].slots == 3 * QUICK_SLOTS
    assert grid["bursty"].phases[1] == ("lm3-burst", QUICK_SLOTS, 2 * QUICK_SLOTS)


def _summary(policy: str, lat: float, jain: float, lm4_success: float) -> dict[str, object]:
    lm_lat = [0.1 * lat, 0.2 * lat, 0.1 * lat, 3.6 * lat]  # mean lat, LM4 the slowest
    success = [1.0, 1.0, 1.0, lm4_success]
    conflicts = paper.TABLE2.get(policy, paper.Conflicts(0.1, 700.0, 300.0, 0.5))
    reconf = {
        "activations_per_100": paper.TABLE3_ALL.activations_per_100,
        "deactivations_per_100": paper.TABLE3_ALL.deactivations_per_100,
        "set_change_ratio": paper.TABLE3_SET_CHANGE_RATIO,
        "per_lm": [
            {
                "lm": lm,
                "activations_per_100": r.activations_per_100,
                "deactivations_per_100": r.deactivations_per_100,
            }
            for lm, r in paper.TABLE3.items()
        ],
    }
    return {
        "scenario": "testbed",
        "policy": policy,
        "seed": 1,
        "mean_latency_s": lat,
        "lm_mean_latency_s": lat,
        "jain": jain,
        "success_ratio": 0.9,
        "windows": [{"jain": jain, "objective": lat / 2000, "lm_mean_latency_s": lat}] * 2,
        "per_lm": [
            {"lm": lm, "mean_latency_s": x, "success_ratio": ok, "lower_bound_s": 1.0}
            for lm, x, ok in zip(paper.LMS, lm_lat, success, strict=True)
        ],
        "conflicts": {
            "ratio": conflicts.ratio,
            "conflict_queue_delay_s": conflicts.conflict_queue_delay_s,
            "non_conflict_queue_delay_s": conflicts.non_conflict_queue_delay_s,
            "conflict_timeout_ratio": conflicts.conflict_timeout_ratio,
        },
        "reconfiguration": reconf,
    }


def _paper_runs(**changes: tuple[float, float, float]) -> list[RunData]:
    empty = RequestTable(0.5, paper.LMS, (), (), (), (), (), ())
    runs = []
    for p in paper.METHODS:
        h = UNPRINTED.get(p, paper.FIG6[p])
        ref = paper.FIG6[p]
        lat, jain = h.latency_s or ref.latency_s, h.jain or ref.jain
        lm4 = paper.FIG7.get(p, {}).get("lm4", paper.LMResult(None, 0.3)).success
        lat, jain, lm4 = changes.get(p, (lat, jain, lm4))
        assert lat is not None and jain is not None and lm4 is not None
        spec = RunSpec(resolve_scenario("testbed"), PolicyChoice(p), 1, 10)
        runs.append(RunData(spec, _summary(p, lat, jain, lm4), empty, {}))
    return runs


def _verdicts(runs: list[RunData]) -> dict[str, bool | None]:
    exp = Experiment("testbed", resolve_scenario("testbed"), paper.METHODS, (1,), 10)
    sections, _ = evaluate([exp], runs)
    return {
        c.claim: c.holds
        for s in sections
        if s.key in {"fig6", "fig7", "table2", "table3"}
        for c in s.checks
    }


def test_the_papers_numbers_satisfy_the_papers_orderings() -> None:
    verdicts = _verdicts(_paper_runs())
    assert verdicts and all(verdicts.values()), verdicts


@pytest.mark.parametrize(
    ("change", "flipped"),
    [
        ({"ma": (130.0, 0.925, 0.479)}, {"MA has the lowest latency", "MA < MAL < PerLLM"}),
        ({"rf": (200.0, 0.688, 0.3)}, {"RF has the highest latency"}),
        ({"ma": (96.7, 0.89, 0.479)}, {"MA's Jain's index is above"}),
        ({"rr": (300.0, 0.99, 0.3)}, {"RL and LL have the highest Jain's"}),
        ({"milp": (226.6, 0.837, 0.6)}, {"MILP starves LM4"}),
        ({"perllm": (169.3, 0.895, 0.5)}, {"MA serves the largest share of LM4"}),
    ],
    ids=["ma-slower", "rf-faster", "ma-less-fair", "rr-fairest", "milp-serves-lm4", "perllm-lm4"],
)
def test_one_changed_number_flips_the_checks_that_depend_on_it(
    change: dict[str, tuple[float, float, float]], flipped: set[str]
) -> None:
    verdicts = _verdicts(_paper_runs(**change))
    failed = {claim for claim, holds in verdicts.items() if not holds}
    assert failed == {c for c in verdicts if any(c.startswith(f) for f in flipped)}
    assert len(failed) == len(flipped)
