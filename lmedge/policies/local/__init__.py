"""Router `local`: serve requests where they arrive (the paper's LL routing).

Each (origin, LM) pair goes to the origin when the origin can host the LM,
else to the nearest feasible node by link class (same site, linked site,
other) and then by name. The controller uses `local_routing` as the fallback
for an invalid or failed routing decision, so it must never fail itself.
"""

from __future__ import annotations

from collections.abc import Sequence

from lmedge.api import Arrival, ClusterContext, Decision, Route, RoutingMap, SlotObservation
from lmedge.policies.kit.support import NearestHosts

__all__ = ["LocalRouter", "local_routing"]


def local_routing(ctx: ClusterContext, arrivals: Sequence[Arrival]) -> RoutingMap:
    """The local routing map for these arrivals (pairs no node can serve are left out).

    A request class several LMs serve goes to its first model
    (`ClusterContext.default_model`), named in `Route.model`.
    """
    routes: list[Route] = []
    seen: set[tuple[str, str]] = set()
    nearest = NearestHosts(ctx)  # nearest_feasible_node, per LM once instead of per pair
    for a in sorted(arrivals, key=lambda a: (a.origin, a.lm)):
        model = ctx.default_model(a.lm)
        if (a.origin, a.lm) in seen or model is None:
            continue
        seen.add((a.origin, a.lm))
        dest = nearest(a.origin, model)
        if dest is not None:
            routes.append(
                Route(
                    origin=a.origin,
                    lm=a.lm,
                    destination=dest,
                    model=None if model == a.lm else model,
                )
            )
    return RoutingMap(routes=routes)


class LocalRouter:
    name = "local"

    def route(self, obs: SlotObservation) -> Decision[RoutingMap]:
        return Decision[RoutingMap](
            agent="scheduler",
            policy=self.name,
            source="rule",
            value=local_routing(obs.context, obs.arrivals),
        )
