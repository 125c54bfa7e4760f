"""Admission control with request classes: a rejected first model refuses its classes."""

from __future__ import annotations

from lmedge.api import Arrival, Rejection, Route, RoutingMap, check_routing_map
from lmedge.policies.classes import routes_for_classes
from tests.unit.policies.lyapunov.scenario import paper_testbed

TG = "text-generation"


def test_rejection_of_the_first_model_is_copied_to_its_classes() -> None:
    ctx = paper_testbed()
    arrivals = [
        Arrival(origin="worker-1", lm=TG, requests=1, prompts=3),
        Arrival(origin="worker-2", lm=TG, requests=1, prompts=5),
        Arrival(origin="worker-2", lm="lm1", requests=1, prompts=1),
    ]
    lm_map = RoutingMap(
        routes=[Route(origin="worker-1", lm="lm1", destination="worker-3")],
        rejections=[Rejection(origin="worker-2", lm="lm1")],
    )
    got = routes_for_classes(ctx, lm_map, arrivals)
    assert got.rejected() == {("worker-2", TG), ("worker-2", "lm1")}
    assert [(r.origin, r.lm) for r in got.routes] == [("worker-1", TG)]
    assert check_routing_map(got, ctx, arrivals) == []
