"""What the controller uses when a plugin's output is invalid or the plugin failed.

Each fallback is deterministic given its inputs (the macro fallback takes the
controller's own seeded RNG) and cannot fail for a loaded scenario, because
the loop has nothing left to fall back to after it:

- planner: the random baseline macro policy (docs/design.md "Control loop");
- router: local routing for the slot;
- deployer: keep what runs on the node now, mapped to the nearest feasible
  placement — the least disruptive feasible action (no cold starts, no churn).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from lmedge.api import (
    Arrival,
    ClusterContext,
    LMPlacement,
    MacroPolicy,
    NodeInfo,
    NodeState,
    Placement,
    RoutingMap,
    ServiceInfo,
    check_placement,
    nearest_feasible,
)
from lmedge.policies.local import local_routing
from lmedge.policies.random import random_macro_policy


def fallback_macro_policy(ctx: ClusterContext, rng: random.Random) -> MacroPolicy:
    return random_macro_policy(ctx, rng)


def fallback_routing(ctx: ClusterContext, arrivals: Sequence[Arrival]) -> RoutingMap:
    return local_routing(ctx, arrivals)


def fallback_placement(
    node: NodeInfo, services: Sequence[ServiceInfo], state: NodeState | None
) -> Placement:
    running = {i.lm: i for i in state.instances} if state else {}
    lms = [
        LMPlacement(lm=s.name, mode=i.mode, cpu_cores=i.cpu_cores, vgpus=i.vgpus)
        if (i := running.get(s.name))
        else LMPlacement(lm=s.name, mode="off", cpu_cores=0, vgpus=0)
        for s in services
    ]
    placement = nearest_feasible(Placement(node=node.name, lms=lms), node, services)
    if check_placement(placement, node, services):
        # nearest_feasible gives up only on a node that cannot host anything.
        placement = Placement(
            node=node.name,
            lms=[LMPlacement(lm=s.name, mode="off", cpu_cores=0, vgpus=0) for s in services],
        )
    return placement
