"""Static: each request to the server where a static batch would finish it first.

LYREO contrasts its model with "static batching with single-slot
completion" (seed §III-C): a scheduler that sees each server as processing
the slot's batch sent to it, prefill of the whole batch then decode of its
longest (nominal) output at that batch size, and ignores the requests still
running from earlier slots (here the routing window's batch, by default the
slot's). Our reading of the paper's Static baseline (an assumption: the
seed names it, its definition is not in our copy):
requests in arrival order, each to the server minimizing
`RequestSlot.static_latency_s` (lmedge.policies.kit.requests). It favours
fast servers and overloads them when requests carry over.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

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


class StaticBatchRouter:
    """The `static-batch` router; stateless."""

    name = "static-batch"

    def __init__(self, params: WindowParams | None = None) -> None:
        p = params or WindowParams()
        self.capabilities = Capabilities(
            routes_requests=True, window_s=p.window_s, window_requests=p.window_requests
        )

    def route(self, obs: SlotObservation) -> Decision[RoutingMap]:
        return slot_map(obs, self.name, self._choose)

    def route_requests(self, window: RequestWindow) -> list[Route]:
        return route_window(window, self._choose)

    @staticmethod
    def _choose(slot: RequestSlot, a: Arrival, tokens: int) -> int:
        del a
        est = [slot.static_latency_s(k, tokens) for k in range(len(slot.servers))]
        return est.index(min(est))


def build(params: Mapping[str, Any]) -> StaticBatchRouter:
    """Factory of `static-batch`: its parameters are the routing window's."""
    return StaticBatchRouter(parse_params(WindowParams, params, "static-batch"))
