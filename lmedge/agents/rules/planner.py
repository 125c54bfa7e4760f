"""The planner's rule backend: capacity-proportional water-filling.

The rule (deterministic, used without an LLM endpoint and as the reference
shown to the LLM):

1. Demand d_i: prompts of LM i last epoch (equal shares before the first
   epoch), floored at 5 % of the mean so no LM is starved of a role, times a
   per-LM boost that adapts to last epoch's success ratios:
   boost_i <- clip(boost_i * ((mean rho + 0.05) / (rho_i + 0.05))^0.5, 0.5, 3).
   Under overload this moves capacity toward the LMs that failed more,
   which is what normalised Jain fairness rewards.
2. Capacity units: every vGPU of every GPU node, and 4-core chunks of every
   CPU-only worker (text LMs only). Units are handed out one at a time to the
   LM with the highest pressure d_i / capacity_i, taking the unit with the
   largest marginal rate for it (capacity.py) under the node's constraints
   (memory, vRAM, cores for one pod per LM, maxVgpus). Ties prefer nodes where
   the LM already had its role (no needless churn between epochs), then nodes
   already hosting it, then manifest order.
3. Routing weights p_i,n = capacity_i,n / capacity_i; roles = the LMs given
   units on the node.

GPU-only LMs therefore spread over GPU nodes in proportion to their load, and
text LMs take the CPU node first whenever its marginal rate is at least the
GPU's (LM1 on 4+ cores) and spare GPU time otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lmedge.agents.rules.capacity import cpu_rate, gpu_rate
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


@dataclass
class RulePlannerState:
    """What the rule planner carries between epochs: the per-LM boost."""

    boost: dict[str, float] = field(default_factory=dict)


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


def demand(
    ctx: ClusterContext, traffic: dict[str, int], boost: dict[str, float]
) -> dict[str, float]:
    """Prompts per LM to plan for (relative), with the floor and the boost."""
    lms = [lm for lm in ctx.lm_names if ctx.feasible_nodes(lm)]
    raw = {lm: float(traffic.get(lm, 0)) for lm in lms}
    if sum(raw.values()) <= 0:
        raw = dict.fromkeys(lms, 1.0)
    mean = sum(raw.values()) / max(1, len(raw))
    return {lm: max(v, DEMAND_FLOOR * mean) * boost.get(lm, 1.0) for lm, v in raw.items()}


def plan_macro(
    ctx: ClusterContext,
    traffic: dict[str, int],
    boost: dict[str, float],
    previous: MacroPolicy | None = None,
) -> MacroPolicy:
    """The water-filling macro policy for `ctx` (see the module docstring)."""
    d = demand(ctx, traffic, boost)
    budgets = [
        _NodeBudget(
            name=n.name,
            gpu=n.spec.has_gpu,
            vgpus_free=n.spec.total_vgpus,
            cores_free=n.spec.cpu_cores,
            mem_free=n.spec.memory_gib,
            vram_free=n.spec.total_vram_gib,
        )
        for n in ctx.workers
    ]
    prev_roles = previous.role_map() if previous else {}
    cap: dict[str, float] = dict.fromkeys(d, 0.0)
    cap_at: dict[str, dict[str, float]] = {lm: {} for lm in d}
    saturated: set[str] = set()
    while len(saturated) < len(d):
        lm = max(
            (x for x in d if x not in saturated),
            key=lambda x: (d[x] / cap[x] if cap[x] > 0 else float("inf"), d[x], x),
        )
        best = _best_unit(ctx, lm, budgets, prev_roles)
        if best is None:
            saturated.add(lm)
            continue
        budget, gain = best
        _take(ctx, lm, budget)
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
        ws[ws.index(max(ws))] += round(1.0 - sum(ws), 6)
        routing.append(
            LMRouting(
                lm=lm, weights=[RouteWeight(node=n, p=w) for n, w in zip(nodes, ws, strict=True)]
            )
        )
    roles = [NodeRole(node=b.name, lms=[lm for lm in ctx.lm_names if lm in b.lms]) for b in budgets]
    shares = ", ".join(f"{lm} {len(cap_at[lm])} nodes" for lm in d)
    return MacroPolicy(
        routing=routing,
        roles=roles,
        rationale=f"capacity-proportional water-filling on demand x success boost ({shares})",
    )


def _marginal(ctx: ClusterContext, lm: str, b: _NodeBudget) -> float:
    """Rate added by giving `lm` one more unit on node `b`, or 0 when it does not fit."""
    svc = ctx.service(lm).spec
    node = ctx.node(b.name).spec
    held = b.lms.get(lm)
    if b.gpu:
        if b.vgpus_free < 1 or svc.min_vram_gib > node.total_vram_gib:
            return 0.0
        if held is None:
            if (
                svc.deployment_memory_gib > b.mem_free + 1e-9
                or svc.min_vram_gib > b.vram_free + 1e-9
            ):
                return 0.0
            if svc.default_cpu_cores > b.cores_free + 1e-9:
                return 0.0
            return gpu_rate(svc, node, 1)
        if held >= svc.max_vgpus:
            return 0.0
        return gpu_rate(svc, node, int(held) + 1) - gpu_rate(svc, node, int(held))
    if svc.runs_on != "cpu-or-gpu" or b.cores_free < CPU_CHUNK_CORES - 1e-9:
        return 0.0
    if held is None:
        if svc.deployment_memory_gib > b.mem_free + 1e-9:
            return 0.0
        return cpu_rate(svc, CPU_CHUNK_CORES)
    return cpu_rate(svc, held + CPU_CHUNK_CORES) - cpu_rate(svc, held)


def _best_unit(
    ctx: ClusterContext, lm: str, budgets: list[_NodeBudget], prev_roles: dict[str, list[str]]
) -> tuple[_NodeBudget, float] | None:
    best: tuple[tuple[float, int, int, int], _NodeBudget, float] | None = None
    for i, b in enumerate(budgets):
        gain = _marginal(ctx, lm, b)
        if gain <= 0:
            continue
        key = (
            round(gain, 9),
            int(lm in prev_roles.get(b.name, [])),
            int(lm in b.lms),
            -i,
        )
        if best is None or key > best[0]:
            best = (key, b, gain)
    return None if best is None else (best[1], best[2])


def _take(ctx: ClusterContext, lm: str, b: _NodeBudget) -> None:
    svc = ctx.service(lm).spec
    new = lm not in b.lms
    if new:
        b.mem_free -= svc.deployment_memory_gib
    if b.gpu:
        if new:
            b.vram_free -= svc.min_vram_gib
            b.cores_free -= svc.default_cpu_cores
        b.vgpus_free -= 1
        b.lms[lm] = b.lms.get(lm, 0.0) + 1
    else:
        b.cores_free -= CPU_CHUNK_CORES
        b.lms[lm] = b.lms.get(lm, 0.0) + CPU_CHUNK_CORES


def rule_macro_policy(obs: PlanningObservation, state: RulePlannerState) -> MacroPolicy:
    """Update the boost from last epoch and plan (the rule planner's whole step)."""
    update_boost(state, obs.last)
    return plan_macro(obs.context, obs.traffic, state.boost, obs.previous)
