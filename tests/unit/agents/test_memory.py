"""Episodic memory selection: best, worst and the most similar traffic mix."""

from __future__ import annotations

from lmedge.agents.memory import select_cases, traffic_similarity
from lmedge.api import EpochMetrics, MacroPolicy, MemoryCase


def _case(epoch: int, objective: float | None, traffic: dict[str, int]) -> MemoryCase:
    metrics = EpochMetrics(
        per_lm=[],
        requests=0,
        successes=0,
        mean_latency_s=None,
        jain=None,
        f_norm=None,
        t_norm=None,
        objective=objective,
    )
    return MemoryCase(
        epoch=epoch,
        traffic=traffic,
        policy=MacroPolicy(routing=[], roles=[]),
        metrics=metrics,
        objective=objective,
    )


def test_similarity() -> None:
    assert traffic_similarity({"a": 1, "b": 0}, {"a": 5}) == 1.0
    assert traffic_similarity({"a": 1}, {"b": 1}) == 0.0
    assert traffic_similarity({}, {"a": 1}) == 0.0


def test_best_worst_and_similar_each_once() -> None:
    cases = [
        _case(0, 0.30, {"lm1": 100, "lm2": 0}),
        _case(1, 0.10, {"lm1": 50, "lm2": 50}),
        _case(2, 0.50, {"lm1": 50, "lm2": 50}),
        _case(3, 0.20, {"lm1": 0, "lm2": 100}),
        _case(4, None, {"lm1": 0, "lm2": 100}),
    ]
    picked = select_cases(cases, {"lm1": 1, "lm2": 99})
    assert [(s.label, s.case.epoch) for s in picked] == [
        ("best", 1),
        ("worst", 2),
        ("similar", 3),
    ]


def test_empty_and_unscored() -> None:
    assert select_cases([], {"lm1": 1}) == []
    assert select_cases([_case(0, None, {"lm1": 1})], {"lm1": 1}) == []
    only = select_cases([_case(0, 0.2, {"lm1": 1})], {"lm1": 1})
    assert [s.label for s in only] == ["best"]
