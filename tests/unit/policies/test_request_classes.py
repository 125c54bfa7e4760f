"""Request classes in the routers: CEMA chooses the model; the others use the first one.

On the paper testbed lm1 (quality unset) and lm2 both declare
`serves: [text-generation]`.
"""

from __future__ import annotations

import pytest

from lmedge.api import Arrival, ClusterContext, Route, RoutingMap, check_routing_map
from lmedge.policies.cema import BatchEvaluator, CemaRouter, PriorQualityPredictor, Weights, build
from lmedge.policies.classes import lm_arrivals, routes_for_classes
from lmedge.policies.local import local_routing
from tests.unit.policies.lyapunov.scenario import paper_testbed, slot_obs

TG = "text-generation"


def test_lm_arrivals_merge_a_class_into_its_first_model() -> None:
    ctx = paper_testbed()
    arrivals = [
        Arrival(origin="worker-1", lm=TG, requests=1, prompts=3),
        Arrival(origin="worker-1", lm="lm1", requests=1, prompts=2),
        Arrival(origin="worker-2", lm=TG, requests=1, prompts=5),
    ]
    got = [(a.origin, a.lm, a.requests, a.prompts) for a in lm_arrivals(ctx, arrivals)]
    assert got == [("worker-1", "lm1", 2, 5), ("worker-2", "lm1", 1, 5)]
    only_lms = arrivals[1:2]
    assert lm_arrivals(ctx, only_lms) == only_lms


def test_routes_for_classes_copy_the_first_models_route() -> None:
    ctx = paper_testbed()
    arrivals = [
        Arrival(origin="worker-1", lm=TG, requests=1, prompts=3),
        Arrival(origin="worker-1", lm="lm1", requests=1, prompts=2),
        Arrival(origin="worker-2", lm=TG, requests=1, prompts=5),
    ]
    lm_map = RoutingMap(
        routes=[
            Route(origin="worker-1", lm="lm1", destination="worker-3"),
            Route(origin="worker-2", lm="lm1", destination="worker-2"),
        ]
    )
    got = routes_for_classes(ctx, lm_map, arrivals)
    assert [(r.origin, r.lm, r.destination, r.model) for r in got.routes] == [
        ("worker-1", "lm1", "worker-3", None),
        ("worker-1", TG, "worker-3", "lm1"),
        ("worker-2", TG, "worker-2", "lm1"),
    ]
    assert check_routing_map(got, ctx, arrivals) == []
    assert routes_for_classes(ctx, lm_map, arrivals[1:2]) is lm_map


def test_local_routing_serves_a_class_with_its_first_model_nearby() -> None:
    ctx = paper_testbed()
    arrivals = [Arrival(origin="worker-1", lm=TG, requests=1, prompts=3)]
    (r,) = local_routing(ctx, arrivals).routes
    assert (r.lm, r.destination, r.model) == (TG, "worker-1", "lm1")


def test_cema_alleles_span_every_model_of_the_class() -> None:
    ctx = paper_testbed()
    obs = slot_obs([("worker-1", TG, 4), ("worker-2", "lm3", 2)], ctx=ctx)
    ev = BatchEvaluator(obs, PriorQualityPredictor(ctx), Weights(0.25, 0.25, 0.25, 0.25), 2.0)
    models = {ev.dests[d][1] for d in ev.legal[0]}
    assert models == {"lm1", "lm2"}
    assert {ev.dests[d][1] for d in ev.legal[1]} == {"lm3"}


@pytest.mark.parametrize(("q1", "q2", "model"), [(0.1, 1.0, "lm2"), (1.0, 0.1, "lm1")])
def test_cema_quality_weight_picks_the_better_model(q1: float, q2: float, model: str) -> None:
    ctx = paper_testbed()
    services = [
        s.model_copy(update={"spec": s.spec.model_copy(update={"quality": q})})
        if (q := {"lm1": q1, "lm2": q2}.get(s.name)) is not None
        else s
        for s in ctx.services
    ]
    ctx = ClusterContext(nodes=ctx.nodes, services=services)
    router = build(ctx, 1, {"w_quality": 1.0, "w_cost": 0.0, "w_energy": 0.0, "w_time": 0.0})
    assert isinstance(router, CemaRouter)
    obs = slot_obs([("worker-2", TG, 4)], ctx=ctx)
    (r,) = router.route(obs).value.routes
    assert (r.lm, r.model) == (TG, model)
    assert check_routing_map(router.route(obs).value, ctx, obs.arrivals) == []


def test_prior_predictor_learns_per_serving_model() -> None:
    from lmedge.api import RequestRecord

    ctx = paper_testbed()
    p = PriorQualityPredictor(ctx, default=0.5, prior_weight=1.0)
    rec = RequestRecord(
        id="x",
        lm=TG,
        model="lm2",
        origin="worker-1",
        destination="worker-2",
        prompts=1,
        slot=0,
        submit_s=0.0,
        outcome="success",
    )
    p.observe([rec])
    assert p.predict(TG, "worker-2", "lm2") == pytest.approx(0.75)
    assert p.predict(TG, "worker-2", "lm1") == pytest.approx(0.5)
