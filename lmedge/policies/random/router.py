"""Router `random`: each (origin, LM) pair goes to a uniformly random feasible node;
`random-request`: each request to a uniformly random server of its LM."""

from __future__ import annotations

import random

from lmedge.api import Arrival, Decision, Route, RoutingMap, SlotObservation
from lmedge.policies.kit.requests import RequestSlot, route_requests
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
    """Uniformly random server per request (LYREO's Random baseline), seeded."""

    name = "random-request"

    def __init__(self, seed: int = 0) -> None:
        self._rng = random.Random(seed)

    def route(self, obs: SlotObservation) -> Decision[RoutingMap]:
        def choose(slot: RequestSlot, a: Arrival, tokens: int) -> int:
            del a, tokens
            return self._rng.randrange(len(slot.servers))

        return route_requests(obs, self.name, choose)
