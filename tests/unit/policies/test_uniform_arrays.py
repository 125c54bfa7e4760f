"""The array-credit `uniform` router routes exactly as the scalar round-robin it replaced."""

from __future__ import annotations

import pytest

from lmedge.api import Route, RoutingMap, SlotObservation
from lmedge.bench.runner import emulated_backend, resolve_scenario
from lmedge.controller.assembly import PolicyChoice, build_plugins
from lmedge.controller.loop import ControlLoop
from lmedge.policies.uniform import UniformRouter
from lmedge.sim import load_scenario


class ScalarUniform:
    """The router as written before: dict credits, weights rebuilt per pair."""

    def __init__(self) -> None:
        self.credit: dict[str, dict[str, float]] = {}

    def route(self, obs: SlotObservation) -> RoutingMap:
        ctx = obs.context
        routes = []
        for a in sorted(obs.arrivals, key=lambda a: (a.lm, a.origin)):
            if not ctx.has_service(a.lm):
                continue
            feasible = ctx.feasible_nodes(a.lm)
            weights: dict[str, float] = {}
            if obs.macro is not None:
                w = obs.macro.weights().get(a.lm, {})
                weights = {n: w.get(n, 0.0) for n in feasible if w.get(n, 0.0) > 0}
            weights = weights or dict.fromkeys(feasible, 1.0)
            credit = self.credit.setdefault(a.lm, {})
            for n, x in weights.items():
                credit[n] = credit.get(n, 0.0) + x
            dest = min(weights, key=lambda n: (-credit[n], n))
            credit[dest] -= sum(weights.values())
            routes.append(Route(origin=a.origin, lm=a.lm, destination=dest))
        return RoutingMap(routes=routes)


@pytest.mark.parametrize(("profile", "seed"), [("al", 1), ("ma", 2)])
def test_array_credits_route_as_the_scalar_algorithm(profile: str, seed: int) -> None:
    backend = emulated_backend(load_scenario(resolve_scenario("testbed")), seed)
    ctx = backend.context()
    # the ma profile's planner gives non-uniform macro weights; al's static one uniform
    loop = ControlLoop(backend, build_plugins(PolicyChoice(profile), ctx, seed), run_id="t")
    new, old = UniformRouter(), ScalarUniform()
    routed = 0
    for t in range(8):
        loop.step(t)
        plans = [d.value for d in loop.result.decisions if d.agent == "planner"]
        obs = SlotObservation(
            slot=t + 1,
            epoch=0,
            context=ctx,
            macro=plans[-1] if plans else None,
            snapshot=backend.snapshot(t + 1),
            arrivals=backend.arrivals(t + 1),
        )
        want = old.route(obs)
        assert new.route(obs).value == want, t  # credits carry over slots in both
        routed += len(want.routes)
    assert routed > 0
