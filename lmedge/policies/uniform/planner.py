"""Planner `static` (alias `none`): no planning; uniform weights, full role sets.

Every LM's weight is spread evenly over its feasible nodes, and every worker's
role set is every LM it can host, added in manifest order while the set still
fits (memory, vGPUs for GPU-only LMs). The same policy every epoch: the
profiles without a planner (the paper's RR, RF, LL, ...) use it.
"""

from __future__ import annotations

from lmedge.api import (
    ClusterContext,
    Decision,
    LMRouting,
    MacroPolicy,
    NodeRole,
    PlanningObservation,
    RouteWeight,
)
from lmedge.policies.kit.support import fits_role, weights_summing_to_one


def uniform_macro_policy(ctx: ClusterContext) -> MacroPolicy:
    routing: list[LMRouting] = []
    for lm in ctx.lm_names:
        feasible = ctx.feasible_nodes(lm)
        if feasible:
            w = weights_summing_to_one(dict.fromkeys(feasible, 1.0))
            routing.append(
                LMRouting(lm=lm, weights=[RouteWeight(node=n, p=w[n]) for n in feasible])
            )
    roles: list[NodeRole] = []
    for node in ctx.workers:
        chosen: list[str] = []
        for lm in ctx.lm_names:
            if ctx.can_host(node.name, lm) and fits_role(ctx, node.name, [*chosen, lm]):
                chosen.append(lm)
        roles.append(NodeRole(node=node.name, lms=chosen))
    return MacroPolicy(routing=routing, roles=roles, rationale="static: uniform weights")


class StaticPlanner:
    name = "static"

    def __init__(self, name: str = "static") -> None:
        self.name = name
        self._cached: MacroPolicy | None = None

    def plan(self, obs: PlanningObservation) -> Decision[MacroPolicy]:
        if self._cached is None:
            self._cached = uniform_macro_policy(obs.context)
        return Decision[MacroPolicy](
            agent="planner", policy=self.name, source="rule", value=self._cached
        )
