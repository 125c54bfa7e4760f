"""Request classes for routers that only know LMs (every router but `cema`).

A request class several LMs serve (`LMServiceSpec.serves`) reaches the router
as an `Arrival` whose `lm` is the class. A router that does not choose models
(it does not declare `Capabilities(routes_request_classes=True)`) sees instead the class's
first model (`ClusterContext.default_model`: manifest order), with the class's
arrivals merged into that model's; its routes for the model are then copied
back to the class with `Route.model` set (and its rejections to the class).
With no class arrivals both steps return their input unchanged, so LM-only
workloads behave exactly as before.
"""

from __future__ import annotations

from collections.abc import Sequence

from lmedge.api import Arrival, ClusterContext, Rejection, Route, RoutingMap

__all__ = ["class_arrivals", "lm_arrivals", "routes_for_classes"]


def class_arrivals(ctx: ClusterContext, arrivals: Sequence[Arrival]) -> list[Arrival]:
    """The arrivals whose `lm` is a request class rather than an LM."""
    known = ctx.has_service
    return [a for a in arrivals if not known(a.lm)]


def lm_arrivals(ctx: ClusterContext, arrivals: Sequence[Arrival]) -> list[Arrival]:
    """`arrivals` with each class replaced by its first model, merged per (origin, LM)."""
    known = ctx.has_service
    if all(known(a.lm) for a in arrivals):
        return list(arrivals)
    merged: dict[tuple[str, str], Arrival] = {}
    for a in arrivals:
        lm = a.lm if ctx.has_service(a.lm) else ctx.default_model(a.lm)
        if lm is None:
            continue  # an unknown class: nothing can serve it
        key = (a.origin, lm)
        prev = merged.get(key)
        merged[key] = Arrival(
            origin=a.origin,
            lm=lm,
            requests=a.requests + (prev.requests if prev else 0),
            prompts=a.prompts + (prev.prompts if prev else 0),
        )
    return list(merged.values())


def routes_for_classes(
    ctx: ClusterContext, routing: RoutingMap, arrivals: Sequence[Arrival]
) -> RoutingMap:
    """Copy each (origin, first model) route to the (origin, class) pairs it stands for.

    The model's own route is kept only when the model also had arrivals of
    its own at that origin (or the router routed it without any).
    """
    classes = class_arrivals(ctx, arrivals)
    if not classes:
        return routing
    direct = {(a.origin, a.lm) for a in arrivals if ctx.has_service(a.lm)}
    stands_for: dict[tuple[str, str], list[str]] = {}
    for a in classes:
        model = ctx.default_model(a.lm)
        if model is not None:
            stands_for.setdefault((a.origin, model), []).append(a.lm)
    routes: list[Route] = []
    for r in routing.routes:
        key = (r.origin, r.lm)
        if key not in stands_for or key in direct:
            routes.append(r)
        for cls in dict.fromkeys(stands_for.get(key, [])):
            routes.append(
                Route(origin=r.origin, lm=cls, destination=r.destination, model=r.serving_lm)
            )
    # A rejected (origin, model) pair refuses the classes it stands for as well.
    rejections: list[Rejection] = []
    for j in routing.rejections:
        key = (j.origin, j.lm)
        if key not in stands_for or key in direct:
            rejections.append(j)
        rejections += [
            Rejection(origin=j.origin, lm=c) for c in dict.fromkeys(stands_for.get(key, []))
        ]
    return RoutingMap(routes=routes, rejections=rejections)
