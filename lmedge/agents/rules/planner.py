"""The planner's rule backend: capacity-proportional water-filling.

The rule (deterministic, used without an LLM endpoint and as the reference
shown to the LLM):

1. Demand d_i: prompts of LM i since the last epoch began (`traffic`: the
   last epoch's, plus this epoch's so far on a re-plan mid-epoch). An LM the
   previous plan did not cover (an LMService applied since) has no traffic
   to go by: its prior is its capacity C_i (one typical instance,
   capacity.best_rate, summed over its feasible nodes) times the mean
   relative load d_j / C_j of the LMs with history -- as loaded as the
   average LM, not the floor of an LM with no prompts (gen-1018: a GPU-only
   LM applied mid-run got one unit on a node without a free vGPU and served
   nothing for 15 slots). With no traffic at all (the run's first plan)
   every LM gets an equal share of prompts; that plan is a guess the loop
   replaces after `FIRST_TRAFFIC_SLOTS` slots of traffic
   (`Capabilities.reads_traffic`). (A capacity-proportional guess instead,
   measured on the testbed and thirteen generated dev scenarios, was worse
   on both: the pods started for it keep their GPUs while their queues
   drain, so the first plan outlives its two slots.) The demand is floored
   at 5 % of the mean so no LM is starved of a role, times a
   per-LM boost that adapts to last epoch's success ratios:
   boost_i <- clip(boost_i * ((mean rho + 0.05) / (rho_i + 0.05))^0.5, 0.5, 3).
   Under overload this moves capacity toward the LMs that failed more,
   which is what normalised Jain fairness rewards.
2. Capacity units: 4-core CPU chunks of every worker (after reserving
   `GPU_POD_CORES` per vGPU) and every vGPU. Units go one at a time to the LM
   with the highest pressure d_i / capacity_i, which takes the unit with the
   largest marginal rate for it (capacity.py) under the node's constraints
   (memory, vRAM, one pod per LM and node, maxVgpus; one vGPU per pod on
   multi-GPU nodes, where a second slot lands on another GPU and only runs
   the model in turn). An LM may take units of its planned mode on a node
   (capacity.planned_mode) and a GPU-planned text LM also CPU chunks where it
   holds no vGPU; its first unit on a node fixes its mode there. Ties prefer
   nodes where the LM already had its role (no needless churn between
   epochs), then nodes already hosting it, then manifest order. Every
   feasible node is open to every LM: no node is held back as a place to
   shed load (admission refuses what cannot be served, it does not park it
   on an unplanned node), so no capacity is left idle.
3. Routing weights p_i,n = capacity_i,n / capacity_i; roles = the LMs given
   units on the node, each with the mode of its units there (`NodeRole.modes`,
   the rates the weights assume; the rule deployer starts LMs in it when its
   `follow_modes` parameter is on).
4. The bottleneck guard, on every re-plan (epoch boundary or churn): the
   previous roles are re-expanded for this epoch's demand (steps 2-3 with
   each LM held to its previous nodes among the workers still there; an LM
   or a worker the previous plan did not cover -- applied, added or back up
   since -- is open to every LM, so a new LM takes units anywhere and the
   others rebalance around it). The bottleneck is the LM with the highest
   relative load d_i / capacity_i there. When the fresh plan gives it less
   capacity, the fresh plan is taken only if its highest relative load is
   lower (the estimate that the whole objective improves: the bottleneck
   sets both the fairness term and the worst latency); otherwise the
   previous roles stay, with this epoch's weights. Without it a traffic
   swing at an epoch boundary, or a node lost, could hand a bottleneck LM's
   vGPU to a lighter LM, and admission then refuses the bottleneck's work.
   When an LM has no node left among its previous roles the fresh plan
   applies.

GPU-only LMs therefore spread over GPU nodes in proportion to their load;
text LMs take vGPUs where they are faster there, and the CPU node and the
GPU nodes' spare cores once no vGPU is worth more to them.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from lmedge.agents.rules.capacity import (
    GPU_POD_CORES,
    best_rate,
    cpu_rate,
    gpu_rate,
    planned_mode,
)
from lmedge.api import (
    ClusterContext,
    EpochMetrics,
    LMRouting,
    MacroPolicy,
    NodeRole,
    PlanningObservation,
    RouteWeight,
)

CPU_CHUNK_CORES = 4.0
BOOST_MIN, BOOST_MAX = 0.5, 3.0
DEMAND_FLOOR = 0.05


@dataclass
class _NodeBudget:
    name: str
    gpu: bool
    vgpus_free: int
    cores_free: float
    mem_free: float
    vram_free: float
    lms: dict[str, float] = field(default_factory=dict)  # lm -> vGPUs or cores held
    modes: dict[str, str] = field(default_factory=dict)  # lm -> "gpu" or "cpu"
    #: LMs that may take units here (the previous roles, when re-expanding them); None: all.
    allowed: frozenset[str] | None = None


@dataclass
class RulePlannerState:
    """What the rule planner carries between epochs: the per-LM boost; and whether it
    follows the traffic (`follow_traffic`, the planner parameter: steps 1 and 4)."""

    boost: dict[str, float] = field(default_factory=dict)
    follow_traffic: bool = False


def update_boost(state: RulePlannerState, last: EpochMetrics | None) -> None:
    """Raise the demand of LMs whose success ratio was below the mean last epoch."""
    if last is None:
        return
    ratios = {s.lm: s.success_ratio for s in last.per_lm if s.success_ratio is not None}
    if not ratios:
        return
    mean = sum(ratios.values()) / len(ratios)
    for lm, rho in ratios.items():
        factor = ((mean + 0.05) / (rho + 0.05)) ** 0.5
        b = state.boost.get(lm, 1.0) * factor
        state.boost[lm] = min(BOOST_MAX, max(BOOST_MIN, b))


def capacity(ctx: ClusterContext, lm: str) -> float:
    """C_i: prompts/s of one typical instance of `lm` on each feasible node, summed."""
    svc = ctx.service(lm).spec
    return sum(best_rate(svc, ctx.node(n).spec) for n in ctx.feasible_nodes(lm))


def demand(
    ctx: ClusterContext,
    traffic: dict[str, int],
    boost: dict[str, float],
    previous: MacroPolicy | None = None,
) -> dict[str, float]:
    """Prompts per LM to plan for (relative): traffic, or the prior for an LM
    without history; with the floor and the boost (module docstring, step 1)."""
    lms = [lm for lm in ctx.lm_names if ctx.feasible_nodes(lm)]
    # an LM has history unless a previous plan exists and did not cover it (applied since)
    planned = set(lms) if previous is None else {r.lm for r in previous.routing}
    seen = [lm for lm in lms if lm in planned]
    raw = {lm: float(traffic.get(lm, 0)) for lm in seen}
    if sum(raw.values()) <= 0:
        # no traffic at all (the run's first plan): equal prompt shares, a guess the
        # loop replaces once traffic is seen (Capabilities.reads_traffic)
        return {lm: boost.get(lm, 1.0) for lm in lms}
    cap = {lm: capacity(ctx, lm) for lm in lms}
    loads = [raw[lm] / cap[lm] for lm in seen if cap[lm] > 0]
    k = sum(loads) / len(loads) if loads else 0.0
    for lm in lms:
        if lm not in raw:  # applied since the previous plan: as loaded as the average LM
            raw[lm] = k * cap[lm]
    mean = sum(raw.values()) / max(1, len(raw))
    return {lm: max(raw[lm], DEMAND_FLOOR * mean) * boost.get(lm, 1.0) for lm in lms}


def plan_macro(
    ctx: ClusterContext,
    traffic: dict[str, int],
    boost: dict[str, float],
    previous: MacroPolicy | None = None,
    *,
    follow_traffic: bool = False,
) -> MacroPolicy:
    """The water-filling macro policy for `ctx`, guarded for the bottleneck (module docstring).

    `follow_traffic` off (the default): every LM's demand is its traffic (no prior for
    an LM applied since `previous`), and the guard runs only on an unchanged cluster.
    """
    d = demand(ctx, traffic, boost, previous if follow_traffic else None)
    fresh, cap = _water_fill(ctx, d, previous, None)
    if previous is None or not (follow_traffic or _same_cluster(ctx, previous)):
        return fresh
    kept, cap_kept = _water_fill(ctx, d, previous, _kept_roles(ctx, previous))
    if not all(cap_kept[lm] > 0 for lm in d):
        return fresh
    bottleneck = max(d, key=lambda lm: (d[lm] / cap_kept[lm], lm))
    if cap[bottleneck] >= cap_kept[bottleneck] * (1 - 1e-6):
        return fresh
    worst = max((d[lm] / cap[lm] if cap[lm] > 0 else float("inf")) for lm in d)
    if worst < d[bottleneck] / cap_kept[bottleneck]:
        return fresh
    return kept.model_copy(
        update={
            "rationale": f"{kept.rationale}; previous roles kept: a new plan would take"
            f" capacity from the bottleneck {bottleneck} without lowering the highest load"
        }
    )


def _same_cluster(ctx: ClusterContext, previous: MacroPolicy) -> bool:
    """Whether `previous` was planned for the workers and LMs `ctx` has (no churn since)."""
    return {r.lm for r in previous.routing} == set(ctx.lm_names) and {
        r.node for r in previous.roles
    } == {n.name for n in ctx.workers}


def _kept_roles(ctx: ClusterContext, previous: MacroPolicy) -> dict[str, list[str]]:
    """The roles a re-plan may keep (node -> LMs): the previous roles on the workers
    still there; an LM the previous plan did not cover, and a worker it did not
    plan (added, or back up), are open to every LM (step 4)."""
    roles = previous.role_map()
    planned = {r.lm for r in previous.routing}
    new = [lm for lm in ctx.lm_names if lm not in planned]
    return {
        n.name: [lm for lm in roles[n.name] if ctx.has_service(lm)] + new
        if n.name in roles
        else list(ctx.lm_names)
        for n in ctx.workers
    }


def _water_fill(
    ctx: ClusterContext,
    d: dict[str, float],
    previous: MacroPolicy | None,
    only: dict[str, list[str]] | None,
) -> tuple[MacroPolicy, dict[str, float]]:
    """Steps 2-3 for demand `d`: the policy and each LM's planned rate.

    With `only` (node -> LMs) an LM takes units only on the nodes listed for
    it: the previous roles re-expanded for this epoch's demand.
    """
    budgets = []
    for n in ctx.workers:
        s = n.spec
        reserved = GPU_POD_CORES * s.total_vgpus
        budgets.append(
            _NodeBudget(
                name=n.name,
                gpu=s.has_gpu,
                vgpus_free=s.total_vgpus,
                cores_free=max(0.0, s.cpu_cores - reserved),
                mem_free=s.memory_gib,
                vram_free=s.total_vram_gib,
                allowed=None if only is None else frozenset(only.get(n.name, [])),
            )
        )
    prev_roles = previous.role_map() if previous else {}
    cap: dict[str, float] = dict.fromkeys(d, 0.0)
    cap_at: dict[str, dict[str, float]] = {lm: {} for lm in d}
    users = [lm for lm in d if _best_unit(ctx, lm, budgets, {}) is not None]
    saturated: set[str] = set()
    units = _UnitIndex(ctx, users, budgets, prev_roles)
    while len(saturated) < len(users):
        lm = max(
            (x for x in users if x not in saturated),
            key=lambda x: (d[x] / cap[x] if cap[x] > 0 else float("inf"), d[x], x),
        )
        best = units.best(lm)
        if best is None:
            saturated.add(lm)
            continue
        budget, kind, gain = best
        _take(ctx, lm, budget, kind)
        units.changed(budget)
        cap[lm] += gain
        cap_at[lm][budget.name] = cap_at[lm].get(budget.name, 0.0) + gain
    routing = []
    for lm in d:
        at = cap_at[lm]
        total = sum(at.values())
        nodes = [n.name for n in ctx.workers if n.name in at]
        if total <= 0:
            # Nothing fits concurrently with the others: fall back to every feasible node.
            nodes = ctx.feasible_nodes(lm)
            at = dict.fromkeys(nodes, 1.0)
            total = float(len(nodes))
        ws = [round(at[n] / total, 6) for n in nodes]
        residual, top = round(1.0 - sum(ws), 6), ws.index(max(ws))
        if ws[top] + residual >= 0:
            ws[top] += residual
        else:  # thousands of nodes: 6-digit rounding drifts by more than any one weight
            ws = [at[n] / total for n in nodes]
        routing.append(
            LMRouting(
                lm=lm, weights=[RouteWeight(node=n, p=w) for n, w in zip(nodes, ws, strict=True)]
            )
        )
    roles = [
        NodeRole(
            node=b.name,
            lms=[lm for lm in ctx.lm_names if lm in b.lms],
            modes={lm: b.modes[lm] for lm in ctx.lm_names if lm in b.lms},
        )
        for b in budgets
    ]
    load = ", ".join(f"{lm} {d[lm] / cap[lm]:.2g}" if cap[lm] else f"{lm} -" for lm in d)
    policy = MacroPolicy(
        routing=routing,
        roles=roles,
        rationale=f"capacity water-filling, CPU for text LMs then vGPUs; relative load {load}",
    )
    return policy, cap


def _kinds(ctx: ClusterContext, lm: str, b: _NodeBudget) -> list[str]:
    """Unit kinds `lm` may take on node `b`: its planned mode, and CPU for a text LM
    that is not on the node's vGPUs (LM2 on the cores LM1 leaves)."""
    svc = ctx.service(lm).spec
    node = ctx.node(b.name).spec
    planned = planned_mode(svc, node)
    if not planned or (b.allowed is not None and lm not in b.allowed):
        return []
    if lm in b.modes:
        return [b.modes[lm]]
    kinds = [planned]
    if planned == "gpu" and "cpu" in ctx.modes(b.name, lm):
        kinds.append("cpu")
    return kinds


def _marginal(ctx: ClusterContext, lm: str, b: _NodeBudget, kind: str) -> float:
    """Rate added by giving `lm` one more `kind` unit on node `b`, or 0 when it does not fit."""
    svc = ctx.service(lm).spec
    node = ctx.node(b.name).spec
    held = b.lms.get(lm)
    if held is None and (
        svc.deployment_memory_gib > b.mem_free + 1e-9
        or (kind == "gpu" and svc.min_vram_gib > b.vram_free + 1e-9)
    ):
        return 0.0
    if kind == "gpu":
        # One vGPU per pod on multi-GPU nodes: a second slot would land on another GPU
        # and run the model in turn there (model parallel), not faster.
        most = svc.max_vgpus if len(node.gpus) == 1 else 1
        if b.vgpus_free < 1 or (held is not None and held >= most):
            return 0.0
        v = int(held or 0)
        return gpu_rate(svc, node, v + 1) - gpu_rate(svc, node, v)
    if b.cores_free < CPU_CHUNK_CORES - 1e-9:
        return 0.0
    c = held or 0.0
    return cpu_rate(svc, c + CPU_CHUNK_CORES) - cpu_rate(svc, c)


def _best_unit(
    ctx: ClusterContext,
    lm: str,
    budgets: list[_NodeBudget],
    prev_roles: dict[str, list[str]],
) -> tuple[_NodeBudget, str, float] | None:
    best: tuple[tuple[float, int, int, int], _NodeBudget, str, float] | None = None
    for i, b in enumerate(budgets):
        for kind in _kinds(ctx, lm, b):
            gain = _marginal(ctx, lm, b, kind)
            if gain <= 0:
                continue
            key = (
                round(gain, 9),
                int(lm in prev_roles.get(b.name, [])),
                int(lm in b.lms),
                -i,
            )
            if best is None or key > best[0]:
                best = (key, b, kind, gain)
    return None if best is None else (best[1], best[2], best[3])


def _node_unit(
    ctx: ClusterContext, lm: str, i: int, b: _NodeBudget, prev_roles: dict[str, list[str]]
) -> tuple[tuple[float, int, int, int], str, float] | None:
    """`_best_unit` restricted to node `b` (index `i`): (key, kind, gain) or None."""
    best: tuple[tuple[float, int, int, int], str, float] | None = None
    for kind in _kinds(ctx, lm, b):
        gain = _marginal(ctx, lm, b, kind)
        if gain <= 0:
            continue
        key = (round(gain, 9), int(lm in prev_roles.get(b.name, [])), int(lm in b.lms), -i)
        if best is None or key > best[0]:
            best = (key, kind, gain)
    return best


class _UnitIndex:
    """`_best_unit` for every LM, kept in one heap per LM instead of a scan per unit.

    Taking a unit changes only that node's budget, so only the node's entries
    are recomputed (`changed`); stale entries are skipped by version. The keys
    are `_best_unit`'s and end in the node index, so the heap's maximum is the
    unit the scan would pick. At 1,000 workers this turns the plan from
    O(units x nodes) into O(units x LMs x log nodes).
    """

    def __init__(
        self,
        ctx: ClusterContext,
        lms: list[str],
        budgets: list[_NodeBudget],
        prev_roles: dict[str, list[str]],
    ) -> None:
        self._ctx, self._lms, self._budgets, self._prev = ctx, lms, budgets, prev_roles
        self._index = {b.name: i for i, b in enumerate(budgets)}
        self._version = [0] * len(budgets)
        self._heaps: dict[str, list[tuple[tuple[float, int, int, int], int, int, str, float]]] = {
            lm: [] for lm in lms
        }
        for i in range(len(budgets)):
            self._push(i)

    def _push(self, i: int) -> None:
        b = self._budgets[i]
        for lm in self._lms:
            unit = _node_unit(self._ctx, lm, i, b, self._prev)
            if unit is not None:
                key, kind, gain = unit
                neg = (-key[0], -key[1], -key[2], -key[3])
                heapq.heappush(self._heaps[lm], (neg, self._version[i], i, kind, gain))

    def changed(self, b: _NodeBudget) -> None:
        i = self._index[b.name]
        self._version[i] += 1
        self._push(i)

    def best(self, lm: str) -> tuple[_NodeBudget, str, float] | None:
        heap = self._heaps[lm]
        while heap:
            _, version, i, kind, gain = heap[0]
            if version == self._version[i]:
                return self._budgets[i], kind, gain
            heapq.heappop(heap)
        return None


def _take(ctx: ClusterContext, lm: str, b: _NodeBudget, kind: str) -> None:
    svc = ctx.service(lm).spec
    if lm not in b.lms:
        b.modes[lm] = kind
        b.mem_free -= svc.deployment_memory_gib
        if kind == "gpu":
            b.vram_free -= svc.min_vram_gib
    if kind == "gpu":
        b.vgpus_free -= 1
        b.lms[lm] = b.lms.get(lm, 0.0) + 1
    else:
        b.cores_free -= CPU_CHUNK_CORES
        b.lms[lm] = b.lms.get(lm, 0.0) + CPU_CHUNK_CORES


def rule_macro_policy(obs: PlanningObservation, state: RulePlannerState) -> MacroPolicy:
    """Update the boost from last epoch and plan (the rule planner's whole step)."""
    update_boost(state, obs.last)
    return plan_macro(
        obs.context, obs.traffic, state.boost, obs.previous, follow_traffic=state.follow_traffic
    )
