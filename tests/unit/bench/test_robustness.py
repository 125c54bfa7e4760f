"""The robustness bench's scoring: ratios to each case's best, penalized latency, orderings."""

from __future__ import annotations

from typing import Any

import pytest

from lmedge.bench.robustness import markdown, score

TAU = 900.0


def _summary(
    scenario: str, seed: int, policy: str, j: float, success: float, lat: float
) -> dict[str, Any]:
    """One LM, 10 arrivals, `success` of them served at `lat` s each."""
    ok = round(success * 10)
    return {
        "scenario": scenario,
        "seed": seed,
        "policy": policy,
        "objective": j,
        "success_ratio": success,
        "lm_mean_latency_s": lat,
        "lm_mean_penalized_latency_s": (ok * lat + (10 - ok) * TAU) / 10 if ok else TAU,
        "window_mean_jain": 1 - j,
        "per_lm": [
            {"lm": "a", "arrivals": 10, "successes": ok, "mean_latency_s": lat if ok else None},
            {"lm": "b", "arrivals": 0, "successes": 0, "mean_latency_s": None},
        ],
    }


def test_ratios_are_to_the_best_of_the_same_case() -> None:
    runs = [
        # case 1: ma best J; mal 2x
        _summary("g1", 1, "ma", 0.10, 1.0, 10.0),
        _summary("g1", 1, "mal", 0.20, 0.5, 5.0),
        # case 2: mal best J; ma 1.04x (within 5%)
        _summary("g1", 2, "ma", 0.104, 1.0, 10.0),
        _summary("g1", 2, "mal", 0.10, 1.0, 12.0),
    ]
    payload = score(runs)
    ma, mal = payload["profiles"]["ma"], payload["profiles"]["mal"]
    assert payload["cases"] == 2
    assert ma["objective"]["wins"] == 0.5 and ma["objective"]["within_near"] == 1.0
    assert ma["objective"]["worst_ratio"] == pytest.approx(1.04)
    assert mal["objective"]["worst_ratio"] == pytest.approx(2.0)
    assert mal["objective"]["worst_case"] == "g1 s1"
    # mal's served-only latency is lower in case 1, but half its requests failed:
    # penalized, it is (5 * 5 + 5 * 900) / 10 = 452.5 s against ma's 10 s
    assert ma["penalized_latency"]["wins"] == 1.0
    assert mal["penalized_latency"]["worst_ratio"] == pytest.approx(45.25)
    assert mal["success"]["worst_ratio"] == pytest.approx(2.0)  # best 1.0 / its 0.5
    lowest = next(o for o in payload["orderings"] if o["claim"] == "MA has the lowest latency")
    assert (lowest["holds"], lowest["measured"]) == (1, 2)
    # ma is worse than mal on seed 2 only: within the seeds' spread
    assert payload["worse_beyond_seeds"] == [
        {"profile": "ma", "rival": "mal", "scenarios": 1, "worse": []}
    ]


def test_worse_on_every_seed_is_named() -> None:
    runs = [
        _summary("g1", seed, p, j, 1.0, 10.0)
        for seed in (1, 2)
        for p, j in (("ma", 0.2 + seed / 100), ("mal", 0.1 + seed / 100))
    ]
    payload = score(runs)
    assert payload["worse_beyond_seeds"][0]["worse"] == ["g1"]
    assert "worse than `mal` by J on every seed: 1 of 1 scenarios (g1)" in markdown(payload)


def test_markdown_has_a_row_per_profile_and_the_orderings() -> None:
    runs = [_summary("g1", 1, p, j, 1.0, 10.0) for p, j in (("ma", 0.1), ("rr", 0.3))]
    text = markdown(score(runs))
    rows = [
        line for line in text.splitlines() if line.startswith("| ma ") or line.startswith("| rr ")
    ]
    assert len(rows) == 2 and "| 3.00 |" in rows[1]
    assert "MA < MAL < PerLLM < MILP in latency | – | 0 / 0" in text
