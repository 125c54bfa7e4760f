"""Router `random`: each (origin, LM) pair goes to a uniformly random feasible node."""

from __future__ import annotations

import random

from lmedge.api import Decision, Route, RoutingMap, SlotObservation
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
