"""The slot MILP solved site by site, for clusters too large for one solve.

At 120 workers the joint model has thousands of binaries and HiGHS often
finds no incumbent in its time limit; at 1,000 workers x 16 LMs x ~14,000
batches it has millions and cannot even be built in a slot. Requests are
served near where they arrive (a cross-site hop costs more transfer and the
site's own nodes are usually enough), so the model splits along sites: each
site's subproblem has the site's workers, the batches arriving there and the
site's share of the fairness terms.

Every site gets its greedy plan (`greedy.py`) every slot. The router hands
a few sites a slot, round robin, to HiGHS, each started from its greedy plan,
sharing a per-slot budget as they go: HiGHS returns a plan no worse in
the site's model, with a bound once its root LP is done. So the slot's cost
is bounded by the budget whatever the node count, and every slot has a plan.

Every site's plan is feasible on its own nodes and nodes belong to one site,
so the union is feasible. What is given up is routing across sites (a batch
is served in its origin's site; one whose LM fits nowhere there is left to
the router's nearest-node fallback, as in the joint model) and the coupling
of the fairness terms across sites (each site balances its own service
ratios). The reported gap is the largest gap of the sites HiGHS bounded: a
bound on each site's subproblem, not on the joint model, which is never built.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, replace

from lmedge.api import Arrival, ClusterContext, NodeState, SlotObservation, Snapshot
from lmedge.policies.milp.greedy import greedy_slot
from lmedge.policies.milp.model import Solution, SurrogateWeights, solve_slot

#: Destinations per batch in a site's model (its cheapest by D_bnm, plus the
#: greedy plan's): with every node of a site as a candidate HiGHS rarely finds
#: an incumbent in its share (measured at 8 workers per site: one site of three
#: in 2 s each); the cheapest few are where a batch goes anyway. Two, not
#: three: a 25-worker site's root LP (its bound) then takes ~40 ms instead of
#: ~70 ms of CPU, and on recorded 1,000-worker slots HiGHS improved the greedy
#: plans as much (1.8% of the objective).
SITE_CANDIDATES = 2


@dataclass(frozen=True)
class SiteSplit:
    """Each site's sub-context (its workers and any control node there), built once."""

    contexts: dict[str, ClusterContext]
    site_of: dict[str, str]

    @classmethod
    def of(cls, ctx: ClusterContext) -> SiteSplit:
        by_site: dict[str, list[str]] = defaultdict(list)
        for n in ctx.nodes:
            by_site[n.spec.site].append(n.name)
        sites = sorted(
            s
            for s, names in by_site.items()
            if any(ctx.node(n).spec.role == "worker" for n in names)
        )
        contexts = {
            s: ClusterContext.model_construct(
                nodes=[ctx.node(n) for n in by_site[s]],
                services=ctx.services,
                loop=ctx.loop,
            )
            for s in sites
        }
        site_of = {n.name: n.spec.site for n in ctx.nodes if n.spec.site in contexts}
        return cls(contexts, site_of)


def solve_by_site(
    obs: SlotObservation,
    w: SurrogateWeights,
    split: SiteSplit,
    solve: list[str],
    budget_s: float,
) -> Solution:
    """Every site's greedy plan, and HiGHS on the sites in `solve`, each started from
    its greedy plan; merged (module docstring).

    The sites share `budget_s` of wall-clock time, model
    building and HiGHS: each gets what is left of it over the sites still to solve,
    so one that runs past its limit (HiGHS checks it between steps) takes from the
    next, and the slot's total stays near the budget.
    """
    if not split.contexts:
        return Solution({}, {}, "no worker in any site")
    turn = tuple(solve)
    chosen = set(turn)
    first = next(iter(split.contexts))
    states: dict[str, list[NodeState]] = defaultdict(list)
    for st in obs.snapshot.nodes:
        states[split.site_of.get(st.name, first)].append(st)
    arrivals: dict[str, list[Arrival]] = defaultdict(list)
    for a in obs.arrivals:
        arrivals[split.site_of.get(a.origin, first)].append(a)
    bounded = replace(w, candidates=w.candidates if w.candidates is not None else SITE_CANDIDATES)
    left_s = budget_s
    to_solve = len(chosen)
    dest: dict[tuple[str, str], str] = {}
    placements = {}
    solved = greedy = optimal = variables = 0
    gaps: list[float] = []
    objective = start = 0.0
    for site, sub_ctx in split.contexts.items():
        sub = obs.model_copy(
            update={
                "context": sub_ctx,
                "snapshot": Snapshot.model_construct(
                    slot=obs.snapshot.slot, time_s=obs.snapshot.time_s, nodes=states[site]
                ),
                "arrivals": [a for a in arrivals[site] if sub_ctx.has_node(a.origin)],
            }
        )
        # the greedy plan first: HiGHS's starting point in the bounded model, and the
        # plan of a site HiGHS does not solve this slot
        plan = greedy_slot(sub, w.cpu_modes)
        if site not in chosen:
            dest.update(plan[0])
            placements.update(plan[1])
            greedy += 1
            continue
        started = time.perf_counter()
        deadline = started + max(left_s, 0.0) / to_solve
        sol = solve_slot(sub, replace(bounded, deadline=deadline), plan)
        left_s -= time.perf_counter() - started
        to_solve -= 1
        dest.update(sol.destinations)
        placements.update(sol.placements)
        variables += sol.variables
        if sol.gap is not None:
            gaps.append(sol.gap)
        if sol.objective is not None and sol.start_objective is not None:
            objective += sol.objective
            start += sol.start_objective
        if sol.source == "greedy":
            greedy += 1
            continue
        solved += 1
        optimal += sol.status == "optimal"
    sites = len(split.contexts)
    worst = f", worst gap {max(gaps):.3g}" if gaps else ""
    gain = f", {1 - objective / start:.1%} below their greedy plans" if start > 0 else ""
    status = (
        f"per site: {sites} sites, {len(chosen)} given to HiGHS ({', '.join(turn)}; "
        f"{budget_s:.3g} s{worst}{gain}): "
        f"{solved} improved or proved "
        f"({optimal} optimal), {greedy} greedy plan"
    )
    return Solution(
        dest,
        placements,
        status,
        objective=objective if len(chosen) == sites else None,
        variables=variables,
        # the audit marks the slot as a fallback if any site's plan is greedy
        source="greedy" if greedy else "milp",
        gap=max(gaps) if gaps and len(gaps) == sites else None,
        start_objective=start if len(chosen) == sites else None,
        solved_sites=turn,
    )
