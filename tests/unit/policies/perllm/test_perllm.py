"""PerLLM UCB router: reward shape, exploration under delayed feedback, UCB exploitation."""

from __future__ import annotations

from typing import Any

import pytest

from lmedge.api import RequestRecord, check_routing_map
from lmedge.errors import ConfigError
from lmedge.policies.perllm import PerLLMRouter, build, reward
from tests.unit.policies.lyapunov.scenario import paper_testbed, slot_obs


def record(
    slot: int, origin: str, lm: str, dest: str, latency: float, ok: bool = True
) -> RequestRecord:
    return RequestRecord(
        id=f"{slot}-{origin}-{lm}",
        lm=lm,
        origin=origin,
        destination=dest,
        prompts=1,
        slot=slot,
        submit_s=slot * 30.0,
        inference_s=latency,
        outcome="success" if ok else "timeout",
    )


@pytest.mark.parametrize(
    ("latency", "ok", "expected"),
    [
        (0.0, True, 1.0),
        (450.0, True, 0.5),
        (900.0, True, 0.0),
        (2000.0, True, 0.0),
        (10.0, False, 0.0),
    ],
    ids=["instant", "half-deadline", "at-deadline", "beyond", "timeout"],
)
def test_reward_is_one_minus_normalized_delay(latency: float, ok: bool, expected: float) -> None:
    assert reward(record(0, "worker-1", "lm1", "worker-1", latency, ok), 900.0) == pytest.approx(
        expected
    )


def router(seed: int = 0, **params: Any) -> PerLLMRouter:
    return build(paper_testbed(), seed, params)


def test_without_feedback_every_arm_is_tried_once_before_any_repeats() -> None:
    r = router()
    feasible = paper_testbed().feasible_nodes("lm4")
    chosen = [
        r.route(slot_obs([("worker-2", "lm4", 3)], slot=t)).value.routes[0].destination
        for t in range(len(feasible))
    ]
    assert sorted(chosen) == sorted(feasible)
    assert len(r.pending) == len(feasible)


def test_routes_are_feasible_and_only_for_pairs_with_arrivals() -> None:
    obs = slot_obs([("worker-1", "lm3", 2), ("worker-2", "lm1", 4), ("worker-3", "lm2", 0)])
    obs.arrivals[2].requests = 0
    decision = router().route(obs)
    assert decision.agent == "scheduler" and decision.source == "rule"
    assert {(r.origin, r.lm) for r in decision.value.routes} == {
        ("worker-1", "lm3"),
        ("worker-2", "lm1"),
    }
    assert check_routing_map(decision.value, obs.context, obs.arrivals) == []


def test_exploits_the_fast_arm_after_delayed_rewards_arrive() -> None:
    r = router(exploration=0.2)
    feasible = paper_testbed().feasible_nodes("lm1")
    for t in range(len(feasible)):
        r.route(slot_obs([("worker-1", "lm1", 1)], slot=t))
    # Rewards for all pulls arrive late and at once: worker-4 is fast, the rest slow.
    r.observe(
        [
            record(
                t, "worker-1", "lm1", p.destination, 30.0 if p.destination == "worker-4" else 600.0
            )
            for (t, _, _), p in list(r.pending.items())
        ]
    )
    assert r.pending == {}
    picks = [
        r.route(slot_obs([("worker-1", "lm1", 1)], slot=100 + k)).value.routes[0].destination
        for k in range(5)
    ]
    assert picks == ["worker-4"] * 5


def test_ucb_bonus_eventually_revisits_a_rarely_pulled_arm() -> None:
    r = router(exploration=1.0)
    bandit = r.bandit("worker-2", "lm3")
    assert bandit is not None
    for name in bandit.order:
        times = 1000 if name == "worker-2" else 1
        for _ in range(times):
            bandit.credit(name, 0.6 if name == "worker-2" else 0.5)
    assert bandit.choose(1.0) != "worker-2"  # bonus sqrt(2 ln N / 1) dominates
    assert bandit.choose(0.0) == "worker-2"  # pure exploitation


def test_records_of_foreign_routes_still_count_as_evidence() -> None:
    r = router()
    r.route(slot_obs([("worker-3", "lm2", 1)], slot=0))
    r.observe([record(7, "worker-3", "lm2", "worker-5", 90.0)])
    bandit = r.bandit("worker-3", "lm2")
    assert bandit is not None and bandit.arm("worker-5").rewards == 1
    assert bandit.arm("worker-5").mean == pytest.approx(0.9)


def test_same_seed_same_choices() -> None:
    obs = [slot_obs([("worker-5", "lm4", 2), ("worker-1", "lm2", 5)], slot=t) for t in range(6)]
    a, b = router(seed=7), router(seed=7)
    assert [a.route(o).value for o in obs] == [b.route(o).value for o in obs]


@pytest.mark.parametrize(
    "params", [{"exploration": -1}, {"epsilon": 0.1}], ids=["negative", "unknown"]
)
def test_bad_params_are_rejected(params: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match="perllm-ucb"):
        build(paper_testbed(), 0, params)
