"""The random baseline macro policy (the paper's reference for the planner).

Per LM, routing weights are drawn uniformly from the probability simplex over
the LM's feasible nodes (Dirichlet(1): normalised exponentials). Per worker,
the role set visits the hostable LMs in a random order and keeps each with
probability 1/2 when it still fits the node (memory, vGPUs for GPU-only LMs).
The controller also uses this planner as the fallback for an invalid plan.
"""

from __future__ import annotations

import random

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


def random_macro_policy(ctx: ClusterContext, rng: random.Random) -> MacroPolicy:
    """One draw of the random baseline macro policy for `ctx`."""
    routing: list[LMRouting] = []
    for lm in ctx.lm_names:
        feasible = ctx.feasible_nodes(lm)
        if not feasible:
            continue
        raw = {n: rng.expovariate(1.0) for n in feasible}
        weights = weights_summing_to_one(raw)
        routing.append(
            LMRouting(lm=lm, weights=[RouteWeight(node=n, p=weights[n]) for n in feasible])
        )
    roles: list[NodeRole] = []
    for node in ctx.workers:
        hostable = [lm for lm in ctx.lm_names if ctx.can_host(node.name, lm)]
        rng.shuffle(hostable)
        chosen: list[str] = []
        for lm in hostable:
            if rng.random() < 0.5 and fits_role(ctx, node.name, [*chosen, lm]):
                chosen.append(lm)
        roles.append(NodeRole(node=node.name, lms=sorted(chosen)))
    return MacroPolicy(routing=routing, roles=roles, rationale="random baseline")


class RandomPlanner:
    """Planner `random`: a fresh random baseline macro policy every epoch."""

    name = "random"

    def __init__(self, seed: int = 0) -> None:
        self._rng = random.Random(seed)

    def plan(self, obs: PlanningObservation) -> Decision[MacroPolicy]:
        value = random_macro_policy(obs.context, self._rng)
        return Decision[MacroPolicy](agent="planner", policy=self.name, source="rule", value=value)
