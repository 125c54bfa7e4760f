"""LYREO's per-request routers and baselines route windows: one route per request.

Every one declares `routes_requests` with its window parameters (LYREO's
setting by default: the 1-s slot in one call), answers a `RequestWindow`
with a feasible route per request, in order, and gives a valid slot map
(the fallback) that leaves its state alone. `lyreo-ly`'s virtual queues move
once a slot, at its first window, and are kept across windows.
"""

from __future__ import annotations

from typing import Any

import pytest

from lmedge.api import RequestWindow, Route, capabilities_of, check_routing_map
from lmedge.api.engine_telemetry import EngineTelemetry
from lmedge.errors import ConfigError
from lmedge.policies import leastloaded, staticbatch
from lmedge.policies import random as rnd
from lmedge.policies.lyreo import build_request_router
from lmedge.policies.lyreo.learned import build_learned
from tests.unit.policies.lyreo.windows import lyreo_slot, window_of

ROUTERS: dict[str, Any] = {
    "lyreo-ly": lambda p: build_request_router("lyreo-ly", p),
    "lyreo-nolb": lambda p: build_request_router("lyreo-nolb", p),
    "lyreo-count": lambda p: build_request_router("lyreo-count", p),
    "lyreo": lambda p: build_learned({"policy": "none", **p}, "lyreo"),
    "ll-kv": lambda p: leastloaded.build("ll-kv", p),
    "ll-count": lambda p: leastloaded.build("ll-count", p),
    "static-batch": staticbatch.build,
    "random-request": lambda p: rnd.build_request(3, p),
}


@pytest.mark.parametrize("name", list(ROUTERS), ids=list(ROUTERS))
def test_routes_each_request_of_a_window_in_order(name: str) -> None:
    router = ROUTERS[name]({})
    caps = capabilities_of(router)
    assert caps.routes_requests and caps.window_s == 1.0 and caps.window_requests >= 60
    obs = lyreo_slot("heterogeneous")
    routes: list[Route] = router.route_requests(window_of(obs))
    assert [(r.origin, r.lm) for r in routes] == [(a.origin, a.lm) for a in obs.arrivals]
    assert all(r.destination in obs.context.feasible_nodes(r.lm) for r in routes)
    assert check_routing_map(router.route(obs).value, obs.context, obs.arrivals) == []


@pytest.mark.parametrize("name", list(ROUTERS), ids=list(ROUTERS))
def test_window_parameters_set_the_capabilities_and_are_validated(name: str) -> None:
    caps = capabilities_of(ROUTERS[name]({"window_s": 0.5, "window_requests": 16}))
    assert (caps.window_s, caps.window_requests) == (0.5, 16)
    with pytest.raises(ConfigError, match="window_s"):
        ROUTERS[name]({"window_s": 0})


def _split(window: RequestWindow, k: int) -> tuple[RequestWindow, RequestWindow]:
    """The window as two calls: its first k requests, then the rest (same slot)."""
    return (
        window.model_copy(update={"requests": window.requests[:k]}),
        window.model_copy(update={"requests": window.requests[k:]}),
    )


def test_virtual_queues_move_once_a_slot_and_persist_across_windows() -> None:
    router = build_request_router("lyreo-ly", {})
    obs = lyreo_slot("heterogeneous")
    # an unbalanced start: one server's KV pool is 80% full, the others are idle
    busy = obs.context.feasible_nodes(obs.context.lm_names[0])[0]
    engine = EngineTelemetry(lm=obs.context.lm_names[0], kv_cache_usage=0.8, running=40)
    nodes = [
        n.model_copy(update={"engines": [engine]}) if n.name == busy else n
        for n in obs.snapshot.nodes
    ]
    obs = obs.model_copy(update={"snapshot": obs.snapshot.model_copy(update={"nodes": nodes})})
    first, rest = _split(window_of(obs), 10)
    router.route(obs)  # the slot map leaves Z alone
    assert not any(router.z.values())
    router.route_requests(first)
    z = dict(router.z)
    assert z[busy] > 0
    router.route_requests(rest)  # the same slot: Z stays
    assert router.z == z
    later = window_of(obs.model_copy(update={"slot": obs.slot + 1}))
    router.route_requests(later)  # the next slot: Z grows on the same imbalance
    assert router.z[busy] > z[busy]
