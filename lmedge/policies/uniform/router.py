"""Router `uniform`: spread each LM's traffic over its feasible nodes (the paper's AL).

A routing map names one destination per (origin, LM) pair and slot, so the
spreading happens across pairs and slots with smooth weighted round-robin
(the nginx algorithm): per LM, every node's credit grows by its weight, the
node with the most credit (ties: name) is chosen and pays the total weight.
Over time node n receives a share w_n of the pairs, deterministically and
without RNG. Weights are the macro policy's for the LM when there is one,
restricted to feasible nodes, else uniform over the feasible nodes.
"""

from __future__ import annotations

from lmedge.api import Decision, MacroPolicy, Route, RoutingMap, SlotObservation
from lmedge.policies._support import FeasibleNodes


class UniformRouter:
    name = "uniform"

    def __init__(self) -> None:
        self._credit: dict[str, dict[str, float]] = {}
        self._feasible = FeasibleNodes()

    def route(self, obs: SlotObservation) -> Decision[RoutingMap]:
        ctx = obs.context
        routes: list[Route] = []
        for a in sorted(obs.arrivals, key=lambda a: (a.lm, a.origin)):
            if not ctx.has_service(a.lm):
                continue
            weights = _weights(obs.macro, a.lm, self._feasible(ctx, a.lm))
            if not weights:
                continue
            credit = self._credit.setdefault(a.lm, {})
            for n, w in weights.items():
                credit[n] = credit.get(n, 0.0) + w
            dest = min(weights, key=lambda n: (-credit[n], n))
            credit[dest] -= sum(weights.values())
            routes.append(Route(origin=a.origin, lm=a.lm, destination=dest))
        return Decision[RoutingMap](
            agent="scheduler", policy=self.name, source="rule", value=RoutingMap(routes=routes)
        )


def _weights(macro: MacroPolicy | None, lm: str, feasible: list[str]) -> dict[str, float]:
    if macro is not None:
        w = macro.weights().get(lm, {})
        chosen = {n: w.get(n, 0.0) for n in feasible if w.get(n, 0.0) > 0}
        if chosen:
            return chosen
    return dict.fromkeys(feasible, 1.0)
