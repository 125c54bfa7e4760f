"""CEMA-Router: evaluator terms, the load-aware seed, memetic search, predictors."""

from __future__ import annotations

import random
from typing import Any

import pytest

from lmedge.api import (
    ClusterContext,
    NodeInfo,
    PowerProfile,
    RequestRecord,
    ServiceInfo,
    check_routing_map,
)
from lmedge.errors import ConfigError
from lmedge.policies.cema import (
    BatchEvaluator,
    CemaRouter,
    PriorQualityPredictor,
    Weights,
    build,
    rag_available,
)
from lmedge.policies.cema.quality import class_description
from lmedge.policies.kit.estimates import transfer_s
from tests.unit.policies.lyapunov.scenario import paper_testbed, slot_obs

EQUAL = Weights(0.25, 0.25, 0.25, 0.25)


def full_slot(seed: int) -> list[tuple[str, str, int]]:
    rng = random.Random(seed)
    ctx = paper_testbed()
    return [(n.name, lm, rng.randint(1, 8)) for n in ctx.workers for lm in ctx.lm_names]


def evaluator(arrivals: list[tuple[str, str, int]], **kw: Any) -> BatchEvaluator:
    obs = slot_obs(arrivals, kw.get("backlog"), kw.get("running"), kw.get("ctx"))
    ctx = obs.context
    return BatchEvaluator(obs, PriorQualityPredictor(ctx), kw.get("weights", EQUAL), 2.0)


def test_makespan_is_backlog_plus_assigned_service_plus_transfer() -> None:
    ev = evaluator(
        [("worker-2", "lm4", 2), ("worker-3", "lm4", 1)],
        backlog={"worker-2": {"lm4": 3}},
        running={"worker-2": {"lm4": "gpu"}},
    )
    d = ev.dests.index(("worker-2", "lm4"))
    both_local = [d, d]
    per = paper_testbed().service("lm4").spec.profile.gpu_seconds_per_prompt
    finish = 3 * per + 2 * per + 1 * per
    _, _, _, t = ev.raw(both_local)
    net = transfer_s(paper_testbed(), "worker-3", "worker-2", "lm4", 1)
    assert t == pytest.approx(finish + net)


@pytest.mark.parametrize("seed", [1, 2, 3], ids=["s1", "s2", "s3"])
def test_normalized_terms_are_bounded_and_fitness_in_unit_interval(seed: int) -> None:
    ev = evaluator(full_slot(seed))
    rng = random.Random(seed)
    for _ in range(50):
        c = [rng.choice(legal) for legal in ev.legal]
        q, cost, e, t = ev.raw(c)
        assert 0 <= q <= ev.q_ub + 1e-9 and 0 <= e <= ev.e_ub + 1e-9 and t <= ev.t_ub + 1e-9
        assert cost == 0.0  # testbed nodes declare no price
        assert 0.0 <= ev.fitness(c) <= 1.0


def test_load_aware_seed_avoids_a_deep_backlog() -> None:
    ev = evaluator(
        [("worker-2", "lm4", 8), ("worker-2", "lm3", 1)],
        backlog={"worker-2": {"lm4": 50, "lm3": 0}},
        running={n: {"lm4": "gpu", "lm3": "gpu"} for n in ("worker-2", "worker-3", "worker-4")},
    )
    seed = CemaRouter.load_aware(ev)
    assert ev.dests[seed[0]][0] != "worker-2"  # 50 queued LM4 prompts there
    assert ev.dests[seed[1]] == ("worker-2", "lm3")  # local, running, no queue


def test_search_is_never_worse_than_its_seed_and_is_reproducible() -> None:
    obs = slot_obs(full_slot(4), {"worker-6": {"lm2": 20}}, {"worker-6": {"lm2": "gpu"}})
    a, b = build(paper_testbed(), 11, {}), build(paper_testbed(), 11, {})
    da, db = a.route(obs), b.route(obs)
    assert da.value == db.value
    assert check_routing_map(da.value, obs.context, obs.arrivals) == []
    ev = BatchEvaluator(obs, a.predictor, a.weights, 2.0)
    assert a.last_fitness is not None and a.last_fitness <= ev.fitness(CemaRouter.load_aware(ev))


def priced_context() -> ClusterContext:
    base = paper_testbed()
    nodes = []
    for n in base.nodes:
        price = 50.0 if n.name == "worker-6" else 0.1
        spec = n.spec.model_copy(update={"power": PowerProfile(cost_per_hour=price)})
        nodes.append(NodeInfo(name=n.name, spec=spec))
    return ClusterContext(nodes=nodes, services=base.services)


def test_cost_weight_steers_away_from_the_expensive_node() -> None:
    ctx = priced_context()
    obs = slot_obs([("worker-6", "lm3", 4), ("worker-6", "lm4", 4)], ctx=ctx)
    cheap = build(ctx, 0, {"w_quality": 0, "w_cost": 1, "w_energy": 0, "w_time": 0}).route(obs)
    assert all(r.destination != "worker-6" for r in cheap.value.routes)
    fast = build(ctx, 0, {"w_quality": 0, "w_cost": 0, "w_energy": 0, "w_time": 1}).route(obs)
    assert any(r.destination == "worker-6" for r in fast.value.routes)  # local, no transfer


def test_prior_predictor_blends_spec_quality_with_observed_success() -> None:
    base = paper_testbed()
    services = [
        ServiceInfo(name=s.name, spec=s.spec.model_copy(update={"quality": 0.5}))
        for s in base.services
    ]
    ctx = ClusterContext(nodes=base.nodes, services=services)
    pred = PriorQualityPredictor(ctx, prior_weight=10)
    assert pred.predict("lm1", "worker-1", "lm1") == 0.5
    ok = [
        RequestRecord(
            id=str(k),
            lm="lm1",
            origin="worker-1",
            destination="worker-1",
            prompts=1,
            slot=0,
            submit_s=0,
            outcome="success",
        )
        for k in range(10)
    ]
    pred.observe(ok)
    assert pred.predict("lm1", "worker-1", "lm1") == pytest.approx(0.75)
    assert pred.predict("lm1", "worker-2", "lm1") == 0.5


def test_class_description_carries_metadata_only() -> None:
    text = class_description(paper_testbed(), "lm3")
    assert (
        text == "request class lm3: image-to-text with model Salesforce/blip-image-captioning-base"
    )


@pytest.mark.slow
@pytest.mark.skipif(rag_available() is not None, reason=str(rag_available()))
def test_rag_predictor_learns_from_similar_history() -> None:
    router = build(paper_testbed(), 0, {"predictor": "rag"})
    records = [
        RequestRecord(
            id=f"{k}",
            lm="lm1",
            origin="worker-1",
            destination=dest,
            prompts=1,
            slot=0,
            submit_s=0,
            outcome=outcome,
        )
        for k, (dest, outcome) in enumerate(
            [("worker-2", "timeout")] * 6 + [("worker-3", "success")] * 6
        )
    ]
    router.observe(records)
    pred = router.predictor
    assert pred.predict("lm1", "worker-3", "lm1") > pred.predict("lm1", "worker-2", "lm1")
    assert pred.predict("lm4", "worker-5", "lm4") == 1.0  # no history there: the prior


@pytest.mark.parametrize(
    "params",
    [
        {"population": 1},
        {"p_mutation": 2},
        {"predictor": "oracle"},
        {"speed": 1},
        {"search_budget": 0},
    ],
    ids=["tiny-population", "bad-rate", "unknown-predictor", "unknown-key", "no-budget"],
)
def test_bad_params_are_rejected(params: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match="cema"):
        build(paper_testbed(), 0, params)
