"""Request-level routing at the gateway: windows, the router, the seed, the map (no HTTP).

The routers here are fakes with a known answer, behaviour or delay; the
windowing, the fallbacks and the audit are the real `RequestWindows` inside
a real `Gateway` (with the in-process peers of test_gateway).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from lmedge.api import ClusterContext, RequestWindow, Route, Snapshot
from lmedge.api.decisions import RoutingMap
from lmedge.api.gateway_control import RequestRouting
from lmedge.api.inference import Prompt
from lmedge.api.runconfig import PolicyConfig
from lmedge.dataplane.gateway import Gateway, GatewaySettings
from lmedge.dataplane.records import MemorySink
from lmedge.dataplane.wire import RoutingUpdate
from tests.unit.dataplane.test_gateway import FakeModels, Peers, run

SERVICES = {"lm1": "text-to-text", "lm4": "text-to-image"}


@dataclass
class Report:
    """What a CEMA router reports of its window (`requests.Outcome`'s terms)."""

    j: float = 0.4
    seed_j: float = 0.5
    quality_loss: float = 0.1
    cost: float = 0.0
    energy: float = 12.0
    makespan: float = 3.0


class FakeRouter:
    """Routes every request of a window by `answer(window)` after `delay_s` (a thread sleeps)."""

    name = "fake-router"

    def __init__(self, answer: Callable[[RequestWindow], list[Route]], delay_s: float = 0.0):
        self.answer = answer
        self.delay_s = delay_s
        self.windows: list[RequestWindow] = []
        self.last_window: Any = None

    def route_requests(self, window: RequestWindow) -> list[Route]:
        if window.requests and window.requests[0].id == "warm-up":
            return self.answer(window)
        time.sleep(self.delay_s)
        self.windows.append(window)
        routes = self.answer(window)
        self.last_window = Report()
        return routes


def to(node: str) -> Callable[[RequestWindow], list[Route]]:
    def answer(window: RequestWindow) -> list[Route]:
        return [Route(origin=r.origin, lm=r.lm, destination=node) for r in window.requests]

    return answer


def raises(window: RequestWindow) -> list[Route]:
    raise RuntimeError("no solution")


def one_short(window: RequestWindow) -> list[Route]:
    return to("worker-2")(window)[1:]


def routing(ctx: ClusterContext, window_s: float = 0.2, most: int = 128) -> RoutingUpdate:
    return RoutingUpdate(
        run="run-1",
        slot=3,
        routing=RoutingMap(routes=[Route(origin="worker-1", lm="lm1", destination="worker-9")]),
        requests=RequestRouting(
            policy=PolicyConfig(profile="cema-request"),
            context=ctx,
            snapshot=Snapshot(slot=3, time_s=0.0, nodes=[]),
            window_s=window_s,
            window_requests=most,
            budget_s=0.4,
        ),
    )


def cluster(
    router: FakeRouter, seed: FakeRouter, sink: MemorySink
) -> tuple[Gateway, list[Gateway]]:
    peers, models = Peers(), FakeModels()

    def gateway(node: str, origin: bool) -> Gateway:
        settings = GatewaySettings(
            node=node,
            services=SERVICES,  # type: ignore[arg-type]
            peers={"worker-1": "w1", "worker-2": "w2", "worker-3": "w3", "worker-9": "w9"},
            model_urls={"lm1": f"http://{node}/lm1"},
            tau_s=10.0,
        )
        gw = Gateway(
            settings,
            peers=peers,
            models=models,
            sink=sink if origin else MemorySink(),
            build_router=lambda policy, ctx, n: router,
            build_seed=lambda policy, ctx, n: seed,
        )
        peers.gateways[settings.peers[node]] = gw
        return gw

    origin = gateway("worker-1", True)
    return origin, [gateway(n, False) for n in ("worker-2", "worker-3", "worker-9")]


async def _submit_all(origin: Gateway, n: int) -> list[Any]:
    return list(
        await asyncio.gather(
            *(origin.submit("lm1", [Prompt(text=f"p{i}")], f"r{i}") for i in range(n))
        )
    )


CASES = [
    # (router, its delay, seed, who routes, where to, why (in the audit's error))
    (to("worker-2"), 0.0, to("worker-3"), "router", "worker-2", None),
    (to("worker-2"), 2.0, to("worker-3"), "seed", "worker-3", "did not answer within"),
    (raises, 0.0, to("worker-3"), "seed", "worker-3", "RuntimeError: no solution"),
    (to("worker-7"), 0.0, to("worker-3"), "seed", "worker-3", "no address for node worker-7"),
    (one_short, 0.0, to("worker-3"), "seed", "worker-3", "1 routes for 2 requests"),
    (raises, 0.0, raises, "map", "worker-9", "the seed failed"),
    (to("worker-2"), 2.0, to("worker-7"), "map", "worker-9", "the seed's answer cannot"),
]


@pytest.mark.parametrize(
    ("answer", "delay", "seed", "used", "destination", "why"),
    CASES,
    ids=[
        "router",
        "router-late-seed",
        "router-raises-seed",
        "bad-route-seed",
        "wrong-count-seed",
        "both-fail-map",
        "late-then-bad-seed-map",
    ],
)
def test_a_window_goes_by_the_router_else_the_seed_else_the_map(
    ctx: ClusterContext,
    answer: Callable[[RequestWindow], list[Route]],
    delay: float,
    seed: Callable[[RequestWindow], list[Route]],
    used: str,
    destination: str,
    why: str | None,
) -> None:
    sink = MemorySink()
    router, seeder = FakeRouter(answer, delay), FakeRouter(seed)

    async def scenario() -> list[Any]:
        origin, others = cluster(router, seeder, sink)
        origin.set_routing(routing(ctx))
        results = await _submit_all(origin, 2)
        for gw in (origin, *others):
            await gw.close()
        return results

    results = run(scenario)
    # no request lost: both served, where the window's decider sent them
    assert [(r.outcome, r.destination) for r in results] == [("success", destination)] * 2
    assert sorted(r.id for r in sink.records) == ["r0", "r1"]
    [decision] = sink.decisions
    assert decision.window is not None and decision.window.used == used
    assert decision.node == "worker-1" and decision.slot == 3 and decision.run == "run-1"
    assert sorted(a.request for a in decision.window.routes) == ["r0", "r1"]
    assert {a.destination for a in decision.window.routes} == {destination}
    assert decision.window.requests == 2
    if why is None:
        assert decision.source == "rule" and decision.outcome == "accepted"
        assert decision.error is None
        assert (decision.window.j, decision.window.seed_j) == (0.4, 0.5)
    else:
        assert decision.source == "fallback" and decision.outcome == "replaced"
        assert decision.error is not None and why in decision.error
        assert decision.window.j is None


def test_the_router_sees_the_window_and_the_wait_counts_in_the_uplink(
    ctx: ClusterContext,
) -> None:
    sink = MemorySink()
    router = FakeRouter(to("worker-2"))

    async def scenario() -> None:
        origin, others = cluster(router, FakeRouter(to("worker-3")), sink)
        origin.set_routing(routing(ctx, window_s=0.3))
        await _submit_all(origin, 3)
        for gw in (origin, *others):
            await gw.close()

    run(scenario)
    [window] = router.windows
    assert [r.id for r in window.requests] == ["r0", "r1", "r2"]
    assert {(r.origin, r.lm, r.prompts) for r in window.requests} == {("worker-1", "lm1", 1)}
    assert window.context is not None and window.slot == 3
    assert window.end_s >= window.start_s
    # each request waited for its window to close (>= window_s), in its uplink
    assert all(r.uplink_s >= 0.3 for r in sink.records)


def test_a_window_holds_at_most_window_requests(ctx: ClusterContext) -> None:
    sink = MemorySink()
    router = FakeRouter(to("worker-2"))

    async def scenario() -> None:
        origin, others = cluster(router, FakeRouter(to("worker-3")), sink)
        origin.set_routing(routing(ctx, window_s=0.3, most=2))
        await _submit_all(origin, 5)
        for gw in (origin, *others):
            await gw.close()

    run(scenario)
    assert sorted(len(w.requests) for w in router.windows) == [1, 2, 2]
    assert len(sink.records) == 5 and len(sink.decisions) == 3
    assert all(d.window is not None and d.window.used == "router" for d in sink.decisions)


def test_without_request_routing_in_the_push_the_map_routes(ctx: ClusterContext) -> None:
    sink = MemorySink()
    router = FakeRouter(to("worker-2"))

    async def scenario() -> list[Any]:
        origin, others = cluster(router, FakeRouter(to("worker-3")), sink)
        origin.set_routing(routing(ctx))
        origin.set_routing(routing(ctx).model_copy(update={"requests": None}))
        results = await _submit_all(origin, 2)
        for gw in (origin, *others):
            await gw.close()
        return results

    results = run(scenario)
    assert {r.destination for r in results} == {"worker-9"}
    assert router.windows == [] and sink.decisions == []


def test_a_stream_opens_on_its_windows_route(ctx: ClusterContext) -> None:
    sink = MemorySink()

    async def scenario() -> str:
        origin, others = cluster(FakeRouter(to("worker-2")), FakeRouter(to("worker-3")), sink)
        origin.set_routing(routing(ctx))
        opened = await origin.open_stream("lm1", Prompt(text="s"))
        await opened.events.aclose()
        for gw in (origin, *others):
            await gw.close()
        return opened.destination

    assert run(scenario) == "worker-2"
    [decision] = sink.decisions
    assert decision.window is not None and decision.window.used == "router"
