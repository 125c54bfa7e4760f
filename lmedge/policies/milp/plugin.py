"""The `milp` router and deployer: one joint solve per slot, shared by both plugins.

Routing and activation come out of the same MILP, but the catalog builds the
router and each node's deployer separately. The coupling is explicit: the
router owns a `JointPlan`; each `milp` deployer is built with the run's
router (`BuildContext.router`, set when the deployers are built in the same
process) and reads that router's plan. Every slot the router solves and
writes the slot's placements into the plan; a node's deployer returns the
placement solved for its node *in that slot*. The loop calls the router
before the deployers in every slot (paper Fig. 4), which is what makes this
work. The deployer declares `Capabilities(joint_router="milp")`: where the
deployers run in node agents, apart from the router (a cluster), the
profile is refused when it is loaded, with the reason.

When HiGHS finds no incumbent in its time limit the slot gets the greedy
plan of `greedy.py` instead, and both the router's and the deployers'
decisions say so (`source="fallback"`, the solver status in `error`). If a
deployer is asked about a slot the router did not solve at all (the router
failed), it keeps the node's running instances — the safe "no change"
action. A `milp` deployer built without the run's `milp` router is a
configuration error.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import Field

from lmedge.api import (
    Capabilities,
    ClusterContext,
    Decision,
    LMPlacement,
    NodeObservation,
    Placement,
    Route,
    RoutingMap,
    SlotObservation,
)
from lmedge.api.base import built
from lmedge.errors import ConfigError
from lmedge.policies.kit.estimates import LinkTable
from lmedge.policies.kit.params import PluginParams, parse_params
from lmedge.policies.milp.model import Solution, SurrogateWeights, solve_slot
from lmedge.policies.milp.sites import SiteSplit, solve_by_site

NAME = "milp"


class MilpParams(PluginParams):
    service_weight: float = Field(
        default=2.5,
        ge=0,
        description="Weight of 1 - mean modeled service ratio (> 2 keeps rho up).",
    )
    transition_weight: float = Field(
        default=0.05, ge=0, description="Penalty per activation change, averaged over node-LMs."
    )
    time_limit_s: float = Field(
        default=2.0,
        gt=0,
        description="HiGHS wall-clock limit of the joint model's solve; the incumbent is used.",
    )
    mip_gap: float = Field(
        default=0.05, ge=0, lt=1, description="Relative MIP gap at which HiGHS stops."
    )
    decompose_above: int = Field(
        default=60,
        ge=1,
        description=(
            "Workers above which the slot is solved per site (sites.py): every site's "
            "greedy plan, and HiGHS on sites_per_slot of them, round robin."
        ),
    )
    sites_per_slot: int = Field(
        default=1,
        ge=1,
        description=(
            "Per site: how many sites HiGHS solves each slot (round robin, from where the "
            "last slot stopped); the others take their greedy plan, which keeps what runs."
        ),
    )
    site_budget_s: float = Field(
        default=0.1,
        gt=0,
        description=(
            "Per site: wall-clock seconds a slot for the sites HiGHS solves (building "
            "their models and HiGHS), shared as it goes; each site starts from its greedy "
            "plan, so any budget returns a plan."
        ),
    )
    cpu_modes: bool = Field(
        default=False,
        description=(
            "Allow CPU activations. Off by default: the paper's MILP solves for "
            '"a feasible GPU-backed LM activation configuration" (§VI).'
        ),
    )


@dataclass
class JointPlan:
    """The slot's solution, written by the router and read by the deployers."""

    slot: int = -1
    placements: dict[str, Placement] = field(default_factory=dict)
    last: Solution | None = None


class MilpRouter:
    """Solves the joint MILP every slot; routes from it and files the activations."""

    name = NAME

    def __init__(self, context: ClusterContext, params: MilpParams, plan: JointPlan) -> None:
        self.context = context
        self.plan = plan
        self._links: LinkTable | None = None
        self._nearest_of: dict[tuple[str, str], str] = {}
        sites = {n.spec.site for n in context.workers}
        self.split = (
            SiteSplit.of(context)
            if len(context.workers) > params.decompose_above and len(sites) > 1
            else None
        )
        self.sites_per_slot = params.sites_per_slot
        self.site_budget_s = params.site_budget_s
        self._next_site = 0  # the rotation's position in the split's sites
        self.weights = SurrogateWeights(
            lam=context.loop.lam,
            service_weight=params.service_weight,
            transition_weight=params.transition_weight,
            time_limit_s=params.time_limit_s,
            cpu_modes=params.cpu_modes,
            mip_gap=params.mip_gap,
        )

    def route(self, obs: SlotObservation) -> Decision[RoutingMap]:
        # The joint model (small clusters) starts cold: HiGHS solves it to the gap in
        # ~0.1 s on the testbed, and a greedy start steers it to plans near the greedy
        # one (no fairness term). The sites start from their greedy plans (sites.py).
        sol = solve_slot(obs, self.weights) if self.split is None else self._by_site(obs)
        self.plan.slot, self.plan.last = obs.slot, sol
        self.plan.placements = sol.placements
        routes = []
        for a in obs.arrivals:
            if a.requests == 0 or not self.context.feasible_nodes(a.lm):
                continue
            dest = sol.destinations.get((a.origin, a.lm)) or self._nearest(a.origin, a.lm)
            # built, not validated: the names are the context's and the arrival's own
            routes.append(
                built(Route, {"origin": a.origin, "lm": a.lm, "destination": dest, "model": None})
            )
        greedy = sol.source == "greedy"
        return Decision[RoutingMap](
            agent="scheduler",
            policy=NAME,
            source="fallback" if greedy else "rule",
            value=RoutingMap(routes=routes),
            error=sol.status if greedy or not (sol.destinations or not routes) else None,
        )

    def _by_site(self, obs: SlotObservation) -> Solution:
        assert self.split is not None
        names = list(self.split.contexts)
        take = min(self.sites_per_slot, len(names))
        turn = [names[(self._next_site + k) % len(names)] for k in range(take)]
        self._next_site = (self._next_site + take) % max(len(names), 1)
        return solve_by_site(obs, self.weights, self.split, turn, self.site_budget_s)

    def _nearest(self, origin: str, lm: str) -> str:
        """Fallback without a solution: the feasible node with the smallest transfer delay
        of one prompt (ties by name); the context's alone, so kept."""
        key = (origin, lm)
        hit = self._nearest_of.get(key)
        if hit is None:
            if self._links is None:
                self._links = LinkTable(self.context)
            nodes = self.context.feasible_nodes(lm)
            idx = [self._links.index[n] for n in nodes]
            delay = self._links.transfer(origin, lm, 1, idx)
            least = delay.min()
            hit = self._nearest_of[key] = min(
                n for n, d in zip(nodes, delay.tolist(), strict=True) if d == least
            )
        return hit


class MilpDeployer:
    """Returns the activation the router solved for this node and slot."""

    name = NAME
    capabilities = Capabilities(joint_router=NAME)

    def __init__(self, context: ClusterContext, plan: JointPlan) -> None:
        self.context = context
        self.plan = plan

    def place(self, obs: NodeObservation) -> Decision[Placement]:
        node = obs.node.name
        solved = self.plan.slot == obs.slot
        placement = self.plan.placements.get(node) if solved else None
        greedy = solved and self.plan.last is not None and self.plan.last.source == "greedy"
        error = self.plan.last.status if greedy and self.plan.last is not None else None
        if placement is None:
            placement = _running(obs)
            error = f"no MILP plan for slot {obs.slot}: kept the running instances"
        return Decision[Placement](
            agent="deployer",
            policy=NAME,
            source="fallback" if error else "rule",
            value=placement,
            node=node,
            error=error,
        )


def _running(obs: NodeObservation) -> Placement:
    running = {i.lm: i for i in obs.state.instances}
    lms = []
    for s in obs.services:
        inst = running.get(s.name)
        if inst is None:
            lms.append(LMPlacement(lm=s.name, mode="off", cpu_cores=0, vgpus=0))
        else:
            lms.append(
                LMPlacement(lm=s.name, mode=inst.mode, cpu_cores=inst.cpu_cores, vgpus=inst.vgpus)
            )
    return Placement(node=obs.node.name, lms=lms)


def build_router(context: ClusterContext, seed: int, params: Mapping[str, Any]) -> MilpRouter:
    """Factory of the router; it owns the plan its deployers share."""
    del seed
    return MilpRouter(context, parse_params(MilpParams, params, NAME), JointPlan())


def build_deployer(
    context: ClusterContext, seed: int, params: Mapping[str, Any], router: object = None
) -> MilpDeployer:
    """Factory of a node's deployer; needs the run's `milp` router, built in the same process."""
    del seed
    if params:
        raise ConfigError(f"the milp deployer takes no parameters, got: {', '.join(params)}")
    if not isinstance(router, MilpRouter):
        raise ConfigError(
            "the milp deployer needs the milp router of the same run, in the same process (it "
            "places what that router solved jointly): pair them in one profile"
        )
    return MilpDeployer(context, router.plan)
