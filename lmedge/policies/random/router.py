"""Router `random`: each (origin, LM) pair goes to a uniformly random feasible node;
`random-request`: each request to a uniformly random server of its LM, per routing window."""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from lmedge.api import (
    Capabilities,
    Decision,
    RequestWindow,
    Route,
    RoutingMap,
    SlotObservation,
)
from lmedge.policies.kit.params import parse_params
from lmedge.policies.kit.requests import RequestSlot, WindowParams, route_window, slot_map
from lmedge.policies.kit.support import FeasibleNodes


class RandomRouter:
    """Uniformly random destination per pair, among workers that can host the LM."""

    name = "random"

    def __init__(self, seed: int = 0) -> None:
        self._rng = random.Random(seed)
        self._feasible = FeasibleNodes()

    def route(self, obs: SlotObservation) -> Decision[RoutingMap]:
        ctx = obs.context
        routes: list[Route] = []
        for a in sorted(obs.arrivals, key=lambda a: (a.origin, a.lm)):
            feasible = self._feasible(ctx, a.lm)
            if feasible:
                dest = self._rng.choice(feasible)
                routes.append(Route(origin=a.origin, lm=a.lm, destination=dest))
        return Decision[RoutingMap](
            agent="scheduler", policy=self.name, source="rule", value=RoutingMap(routes=routes)
        )


class RandomRequestRouter:
    """Uniformly random server per request (LYREO's Random baseline), seeded.

    The windows draw from their own stream, so how many slot maps (the
    fallback, also random per pair) were asked for does not move them.
    """

    name = "random-request"

    def __init__(self, seed: int = 0, params: WindowParams | None = None) -> None:
        p = params or WindowParams()
        self.capabilities = Capabilities(
            routes_requests=True, window_s=p.window_s, window_requests=p.window_requests
        )
        self._rng = random.Random(seed)
        self._map_rng = random.Random(f"{seed}:slot-map")

    def route(self, obs: SlotObservation) -> Decision[RoutingMap]:
        return slot_map(obs, self.name, lambda slot, a, tokens: self._draw(self._map_rng, slot))

    def route_requests(self, window: RequestWindow) -> list[Route]:
        return route_window(window, lambda slot, a, tokens: self._draw(self._rng, slot))

    @staticmethod
    def _draw(rng: random.Random, slot: RequestSlot) -> int:
        return rng.randrange(len(slot.servers))


def build_request(seed: int, params: Mapping[str, Any]) -> RandomRequestRouter:
    """Factory of `random-request`: its parameters are the routing window's."""
    return RandomRequestRouter(seed, parse_params(WindowParams, params, "random-request"))
