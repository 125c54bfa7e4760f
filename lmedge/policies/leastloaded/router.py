"""Least-Loaded: each request to the server with the least load now (LYREO §V-B).

Global, per request: unlike lmedge's `local` router (the origin if it can
host, else the nearest), every feasible server is a candidate and the load
counts the requests already sent in the routing window (by default the
slot). `by: kv` compares the servers' normalized KV memory-time W_s,
`by: count` their active requests (running + waiting + sent in the
window); `lmedge.policies.kit.requests` defines both. Ties go to the
earlier server in manifest order. Latency plays no part.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field

from lmedge.api import (
    Arrival,
    Capabilities,
    Decision,
    RequestWindow,
    Route,
    RoutingMap,
    SlotObservation,
)
from lmedge.policies.kit.params import parse_params
from lmedge.policies.kit.requests import RequestSlot, WindowParams, route_window, slot_map


class LeastLoadedParams(WindowParams):
    by: Literal["kv", "count"] = Field(
        default="kv", description="kv: KV memory-time W_s; count: active requests."
    )


class LeastLoadedRouter:
    """The `ll-kv` / `ll-count` router; stateless."""

    def __init__(self, name: str, params: LeastLoadedParams) -> None:
        self.name = name
        self.p = params
        self.capabilities = Capabilities(
            routes_requests=True, window_s=params.window_s, window_requests=params.window_requests
        )

    def route(self, obs: SlotObservation) -> Decision[RoutingMap]:
        return slot_map(obs, self.name, self._choose)

    def route_requests(self, window: RequestWindow) -> list[Route]:
        return route_window(window, self._choose)

    def _choose(self, slot: RequestSlot, a: Arrival, tokens: int) -> int:
        del a, tokens
        by_kv = self.p.by == "kv"
        loads = [s.kv_load if by_kv else float(s.active) for s in slot.servers]
        return loads.index(min(loads))


def build(name: str, params: Mapping[str, Any]) -> LeastLoadedRouter:
    """Factory; `ll-kv` and `ll-count` fix `by`."""
    by = "count" if name == "ll-count" else "kv"
    return LeastLoadedRouter(name, parse_params(LeastLoadedParams, {"by": by, **params}, name))
