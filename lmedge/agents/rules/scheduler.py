"""The scheduler's rule backend: macro-guided earliest estimated completion.

For every (origin, LM) pair with arrivals, in decreasing order of prompts
(the largest sets placed first, as in bin packing), or in increasing order
when admission control is on (below):

- candidates are the nodes the macro policy gives the LM weight on or names
  it in the role of (all feasible nodes when there is no macro policy);
- each candidate's cost is the estimated completion of the new prompts:
  (backlog + prompts already sent there this slot + the new prompts)
  / service rate + a cold start when the LM is not running there yet
  + the uplink transfer, where the rate is that of the running instance, or
  of a typical new one (capacity.py) when the LM is only in the node's role;
- a node where the LM is neither running, starting nor in the role (an
  inactive-target conflict) costs `2 tau`: it is chosen only when nothing
  else is feasible;
- a node where the LM still runs but is no longer planned (the planner
  moved it away at an epoch boundary) is "draining": it is estimated like
  any running instance but chosen only when no planned node is usable, so
  its queue empties and the deployer can free the resources for the LMs
  the node is now meant to host. (Feeding it because it happens to run
  would keep its queue nonempty forever, and the deployer never stops an
  LM with queued work: the node's new role would never start.)
- the macro weight breaks ties (it is proportional to planned capacity,
  which the rate already reflects).

The cheapest candidate wins; ties go to the higher weight, then the origin,
then the name.

Admission control (`admit_fraction`): when even the cheapest candidate has a
queue and would complete the set (queue ahead, cold start, transfer and the
set's own service) later than `admit_fraction x deadline`, the pair is
rejected (`RoutingMap.rejections`): its requests are refused at once with
outcome `rejected` (the gateway answers 429 with Retry-After) instead of
being queued. Under overload a FIFO queue otherwise grows until requests
wait about tau and many time out mid-inference, wasting the capacity the
others needed; refusing keeps the queues short, so the admitted requests
finish early and no work is wasted, and the refused user learns it in
milliseconds instead of after tau. Counting the set's own service time,
and taking the pairs smallest first when admission is on, refuses the
largest sets first, so the capacity serves the most requests (success
ratios count requests, not prompts; shortest-first is what maximizes the
count completed by a deadline). Largest-first would let the big sets take
the queue and then refuse the small ones behind them: on the testbed
(seed 2, 200 slots) smallest-first serves LM4 at 0.58 instead of 0.56 and
lowers its mean latency from 137 s to 117 s. An empty queue admits any
set, so a light load refuses nothing. A rejection is a failure in every
metric (lmedge.metrics), so it cannot improve the objective by hiding
requests. The same ranking (top-k per LM) is what the LLM prompt shows.
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter

from lmedge.agents.rules.capacity import best_rate, instance_rate
from lmedge.agents.rules.slot_table import SlotTable
from lmedge.api import (
    Arrival,
    ClusterContext,
    MacroPolicy,
    NodeState,
    Rejection,
    Route,
    RoutingMap,
)
from lmedge.api.base import built
from lmedge.api.constants import COLD_START_S

#: Admission horizon as a fraction of the deadline, or None: admit every set.
#: The router param `admit_fraction` sets it (`off` = None). On by default at
#: 0.3 (270 s of the paper's 900 s): on the recalibrated testbed it serves more
#: requests than admitting everything (success 0.905 vs 0.819, LM4 0.62 vs 0.28,
#: seeds 1-3) and a refused user learns it at once instead of after tau
#: (lmedge/agents/README.md has the table).
ADMIT_FRACTION: float | None = 0.3


def admission_horizon_s(ctx: ClusterContext, lm: str, admit_fraction: float) -> float:
    """The admission cut-off of `lm`'s sets, seconds: `admit_fraction` x the LM's deadline.

    The deadline is `ClusterContext.deadline_s` (the LMService's own
    `deadlineS`, else tau). The rule refuses by it and the router's prompt
    states it (rendering.py), so what the LLM is told is what the rule applies.
    """
    return admit_fraction * ctx.deadline_s(lm)


#: The maps' order; among equal pairs (not a valid map), the routing order.
_PAIR_ATTRS = attrgetter("origin", "lm", "prompts")


def _pair_largest_first(a: Arrival) -> tuple[str, str, int]:
    return (a.origin, a.lm, -a.prompts)


#: Candidate statuses chosen only when no planned node is usable.
LAST_RESORT = frozenset({"off", "draining"})


@dataclass(frozen=True)
class Candidate:
    """One destination option for one LM, as the rule sees it."""

    node: str
    cost_s: float
    start_s: float  # estimated wait before the set starts (queue ahead + cold start)
    backlog: int
    status: str  # "ready", "pending", "role" (will be started), "draining" or "off"
    p: float


@dataclass
class Plan:
    """The macro policy as lookups, computed once per slot (not once per pair)."""

    weights: dict[str, dict[str, float]]
    roles: dict[str, set[str]]
    _feasible: dict[str, list[str]]

    @classmethod
    def of(cls, ctx: ClusterContext, macro: MacroPolicy | None) -> Plan:
        if macro is None:
            return cls({}, {}, {})
        roles = {n: set(lms) for n, lms in macro.role_map().items()}
        return cls(macro.weights(), roles, {})

    def feasible(self, ctx: ClusterContext, lm: str) -> list[str]:
        if lm not in self._feasible:
            self._feasible[lm] = ctx.feasible_nodes(lm)
        return self._feasible[lm]


def transfer_s(ctx: ClusterContext, origin: str, dest: str, kib: float) -> float:
    """Uplink time of `kib` KiB from origin to dest over the declared links."""
    if origin == dest or not ctx.has_node(origin):
        return 0.0
    a, b = ctx.node(origin).spec, ctx.node(dest).spec
    if a.site == b.site:
        bw, lat = a.intra_site_bandwidth_mbps, a.intra_site_latency_ms
    else:
        link = next((x for x in a.links if x.site == b.site), None)
        bw, lat = (link.bandwidth_mbps, link.latency_ms) if link else (100.0, 20.0)
    return lat / 1000.0 + kib * 8.0 / 1024.0 / bw


def candidates(
    ctx: ClusterContext,
    macro: MacroPolicy | None,
    states: dict[str, NodeState],
    lm: str,
    extra: dict[tuple[str, str], int] | None = None,
    prompts: int = 1,
    origin: str | None = None,
    plan: Plan | None = None,
) -> list[Candidate]:
    """Every feasible destination for `lm`, cheapest first."""
    extra = extra or {}
    plan = plan or Plan.of(ctx, macro)
    weights = plan.weights.get(lm, {})
    roles = plan.roles
    svc = ctx.service(lm).spec
    feasible = plan.feasible(ctx, lm)
    planned = {n for n in feasible if weights.get(n, 0.0) > 0 or lm in roles.get(n, ())}
    if not planned:
        planned = set(feasible)
    out: list[Candidate] = []
    tau = ctx.deadline_s(lm)
    for n in feasible:
        st = states.get(n)
        inst = st.instance(lm) if st else None
        backlog = (st.backlog.get(lm, 0) if st else 0) + extra.get((n, lm), 0)
        if inst is None and n not in planned:
            # Not planned and not running: a last resort (a conflict); no estimate needed.
            out.append(Candidate(n, 2 * tau, tau, backlog, "off", 0.0))
            continue
        node = ctx.node(n).spec
        status: str
        if inst is not None:
            rate = instance_rate(svc, node, inst)
            status = inst.status if n in planned else "draining"
            wait = COLD_START_S / 2 if inst.status == "pending" else 0.0
        else:
            rate, status, wait = best_rate(svc, node), "role", COLD_START_S
        if rate <= 0:
            continue
        start = backlog / rate + wait
        if origin is not None:
            start += transfer_s(ctx, origin, n, svc.profile.request_kib * prompts)
        cost = start + prompts / rate
        out.append(Candidate(n, cost, start, backlog, status, weights.get(n, 0.0)))
    out.sort(key=lambda c: (c.cost_s, -c.p, c.node != origin, c.node))
    return out


def rule_routing(
    ctx: ClusterContext,
    macro: MacroPolicy | None,
    states: dict[str, NodeState],
    arrivals: list[Arrival],
    admit_fraction: float | None = ADMIT_FRACTION,
) -> RoutingMap:
    """The rule's routing map for this slot's arrivals (see the module docstring).

    `admit_fraction=None` turns admission control off (every set is admitted).
    """
    plan = Plan.of(ctx, macro)
    # The same choice as the first usable element of `candidates()`, priced
    # with per-slot arrays (slot_table.py): at 1,000 nodes the per-pair
    # Python candidates cost minutes per slot.
    table = SlotTable(ctx, plan.weights, plan.roles, states)
    # An LM's pairs change only that LM's columns, so each LM's pairs are
    # routed together, in the order the whole slot's would take them: by
    # prompts (smallest first with admission control, largest first without),
    # then origin. The pairs are put in the maps' order (origin, LM) first, so
    # an LM's are in origin order and one stable sort by prompts routes them,
    # and the maps need no sort.
    live = sorted(
        (a for a in arrivals if a.requests > 0),
        key=_PAIR_ATTRS if admit_fraction is not None else _pair_largest_first,
    )
    by_lm: dict[str, list[int]] = {}
    for k, a in enumerate(live):
        by_lm.setdefault(a.lm, []).append(k)
    prompts = [a.prompts for a in live]
    chosen: list[str | None] = [None] * len(live)
    refused = [False] * len(live)
    for lm, mine in by_lm.items():
        cols = table.columns(lm) if ctx.has_service(lm) else None
        if cols is None:
            continue
        mine.sort(key=prompts.__getitem__, reverse=admit_fraction is None)
        horizon = None if admit_fraction is None else admission_horizon_s(ctx, lm, admit_fraction)
        picked = table.assign(
            cols,
            [live[k].origin for k in mine],
            [prompts[k] for k in mine],
            ctx.service(lm).spec.profile.request_kib,
            horizon,
        )
        nodes = cols.nodes
        for k, j in zip(mine, picked, strict=True):
            if j < 0:
                refused[k] = True
            else:
                chosen[k] = nodes[j]
    # names from the context and the arrivals: built without validating (~100,000 a slot)
    routes = [
        built(Route, {"origin": a.origin, "lm": a.lm, "destination": d, "model": None})
        for a, d in zip(live, chosen, strict=True)
        if d is not None
    ]
    rejections = [
        built(Rejection, {"origin": a.origin, "lm": a.lm})
        for a, r in zip(live, refused, strict=True)
        if r
    ]
    return RoutingMap(routes=routes, rejections=rejections)
