"""Static: each request to the server where a static batch would finish it first.

LYREO contrasts its model with "static batching with single-slot
completion" (seed §III-C): a scheduler that sees each server as processing
the slot's batch sent to it, prefill of the whole batch then decode of its
longest (nominal) output at that batch size, and ignores the requests still
running from earlier slots. Our reading of the paper's Static baseline
(an assumption: the seed names it, its definition is not in our copy):
requests in arrival order, each to the server minimizing
`RequestSlot.static_latency_s` (lmedge.policies.kit.requests). It favours
fast servers and overloads them when requests carry over.
"""

from __future__ import annotations

from lmedge.api import Arrival, Decision, RoutingMap, SlotObservation
from lmedge.policies.kit.requests import RequestSlot, route_requests


class StaticBatchRouter:
    """The `static-batch` router; stateless."""

    name = "static-batch"

    def route(self, obs: SlotObservation) -> Decision[RoutingMap]:
        def choose(slot: RequestSlot, a: Arrival, tokens: int) -> int:
            del a
            est = [slot.static_latency_s(k, tokens) for k in range(len(slot.servers))]
            return est.index(min(est))

        return route_requests(obs, self.name, choose)
