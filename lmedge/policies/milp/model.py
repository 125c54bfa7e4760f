"""The per-slot MILP of the paper's MILP baseline (§VI item 8), solved with HiGHS.

Variables (all per slot):

- u[b,n,m] binary: batch b (a nonempty (origin, LM) pair) goes to node n, to be
  served in mode m; sum_{n,m} u[b,n,m] = 1.
- y[n,i,m] binary: LM i active on node n in mode m (gpu: 1 vGPU; cpu: default
  cores); sum_m y[n,i,m] <= 1; u[b,n,m] <= y[n,i(b),m]; node budgets on cores,
  deployment memory, vGPUs and vRAM.
- W[n,i,m] >= 0: same-slot congestion, W >= s_im (L0 L - L0^2/2) for tangent
  points L0 (the convex FIFO wait s L^2/2 of L = sum_b k_b u[b,n,m] prompts).
- rho_i in [0, 1], rho_i * demand_i <= sum_{n,m} alpha_im y[n,i,m]: the modeled
  per-LM service ratio (capacity per slot over backlog + arrivals).
- d_ij >= |rho_i - rho_j|: the linearized pairwise differences.

Objective (minimized), the paper's linear surrogate of Eq. 10:

    lam / (tau P) * [ sum_b k_b sum_{n,m} u D_bnm + sum W + sum_ni tau Q_ni (1 - z_ni) ]
    + (1 - lam) * [ mean_{i<j} d_ij + service_weight * (1 - mean_i rho_i) ]
    + transition_weight * mean_{n,i} |z_ni - z0_ni|

with D_bnm = transfer per prompt + cold start (when i is not running on n) +
s_im (Q_ni + 1) (the backlog ahead, then its own service), z_ni = sum_m y,
z0 the current activation and P the prompts in play. The last bracket keeps
queued prompts from being stranded on a deactivated LM (they would time out).
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field, replace
from typing import Any

import highspy
import numpy as np
from highspy._core import _Highs
from scipy.sparse import coo_matrix

from lmedge.api import ClusterContext, LMPlacement, Mode, Placement, SlotObservation
from lmedge.api.constants import COLD_START_S
from lmedge.policies.kit.estimates import (
    allowed_modes,
    link_arrays,
    service_s,
    transfer_bits,
)
from lmedge.policies.milp.greedy import greedy_slot

TANGENTS = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)
# highspy.Highs() turns its callbacks on when built, which prints HiGHS's banner on
# stdout before output_flag can be set; its base class (the bare binding) does not,
# and the model uses no callbacks. test_milp.py holds the solve silent.


@dataclass(frozen=True)
class SurrogateWeights:
    lam: float
    service_weight: float
    transition_weight: float
    time_limit_s: float
    cpu_modes: bool
    mip_gap: float = 0.05
    #: Destinations a batch may take: its `candidates` cheapest (node, mode)
    #: pairs by D_bnm, or every one (None, the joint model). Bounds the model
    #: of a large site (sites.py); the gap is then that of the bounded model.
    candidates: int | None = None
    #: `time.perf_counter()` by which the solve must end (sites.py's budget): HiGHS
    #: gets the lesser of `time_limit_s` and what is left once the model is built.
    deadline: float | None = None


@dataclass
class Solution:
    destinations: dict[tuple[str, str], str]
    placements: dict[str, Placement]
    status: str
    objective: float | None = None
    variables: int = 0
    #: "milp" (HiGHS optimum or incumbent) or "greedy" (no incumbent in the time limit).
    source: str = "milp"
    #: The relative optimality gap of the returned plan, (primal - dual bound) /
    #: primal on the objective with its constant, the bound at least 0 (`_gap`);
    #: None without a bound.
    gap: float | None = None
    #: The objective of the greedy plan HiGHS started from, in the same model.
    start_objective: float | None = None
    #: Per site (sites.py): the sites HiGHS was given this slot, in rotation order.
    solved_sites: tuple[str, ...] = ()


@dataclass
class _Vars:
    """Column bookkeeping for the sparse model."""

    cost: list[float] = field(default_factory=list)
    lower: list[float] = field(default_factory=list)
    upper: list[float] = field(default_factory=list)
    integer: list[int] = field(default_factory=list)

    def add(self, cost: float, lo: float, hi: float, integer: bool) -> int:
        self.cost.append(cost)
        self.lower.append(lo)
        self.upper.append(hi)
        self.integer.append(1 if integer else 0)
        return len(self.cost) - 1


@dataclass
class _Rows:
    rows: list[int] = field(default_factory=list)
    cols: list[int] = field(default_factory=list)
    vals: list[float] = field(default_factory=list)
    lower: list[float] = field(default_factory=list)
    upper: list[float] = field(default_factory=list)

    def add(self, terms: list[tuple[int, float]], lo: float, hi: float) -> None:
        r = len(self.lower)
        for c, v in terms:
            self.rows.append(r)
            self.cols.append(c)
            self.vals.append(v)
        self.lower.append(lo)
        self.upper.append(hi)


# a plan as (destination per (origin, LM), placement per node): the greedy plan
SeedPlan = tuple[dict[tuple[str, str], str], dict[str, Placement]]


def solve_slot(
    obs: SlotObservation,
    w: SurrogateWeights,
    seed_plan: SeedPlan | None = None,
) -> Solution:
    """Build and solve the slot's MILP; the incumbent is used when the time limit hits.

    `seed_plan` is the slot's greedy plan when the caller has it (sites.py):
    with `w.candidates`, each batch keeps its greedy destination among its
    candidates, so the bounded model always has it as a feasible point, and
    HiGHS starts from it. The plan returned then scores no worse than the
    greedy plan in this model (`Solution.start_objective`); it is the greedy
    plan itself when HiGHS finds nothing better in its time limit.
    """
    model = _build(obs, w, seed_plan)
    res, seed_value = _solve(model, w, seed_plan)
    return _decode(obs, w, model, res, seed_plan, seed_value)


@dataclass
class _SlotModel:
    """The slot's MILP as built: the sparse model (`v`, `rows`, `matrix`, the
    objective's `constant`) and the column maps that read a plan out of a point."""

    ctx: ClusterContext
    workers: list[str]
    lms: list[str]
    batches: list[tuple[str, str, int]]
    demand: dict[str, float]
    allowed: dict[tuple[str, str], tuple[Mode, ...]]
    v: _Vars
    rows: _Rows
    constant: float
    matrix: Any
    #: y[(n, i, m)]: LM i active on node n in mode m.
    y: dict[tuple[str, str, Mode], int]
    #: u[(b, n, m)]: batch b sent to node n, served in mode m.
    u: dict[tuple[int, str, Mode], int]
    #: The bounded model's "unplaced" column of each batch.
    slack_of: dict[int, int]
    #: (W column, seconds per prompt, load terms) per (node, LM, mode) with load.
    congestion: list[tuple[int, float, list[tuple[int, float]]]]
    rho: dict[str, int]
    of_lm: dict[str, list[tuple[Mode, int]]]
    differences: list[tuple[int, str, str]]


def _build(
    obs: SlotObservation, w: SurrogateWeights, seed_plan: SeedPlan | None = None
) -> _SlotModel:
    """The slot's MILP (the module docstring's variables, rows and objective).

    With `w.candidates`, a batch keeps `seed_plan`'s destination among its options.
    """
    ctx = obs.context
    tau = ctx.loop.tau_s
    states = {s.name: s for s in obs.snapshot.nodes}
    workers = [n.name for n in ctx.workers]
    lms = ctx.lm_names
    batches = [
        (a.origin, a.lm, max(a.prompts, 1))
        for a in obs.arrivals
        if a.requests > 0 and ctx.feasible_nodes(a.lm)
    ]
    backlog = {
        (n, i): float(states[n].backlog.get(i, 0)) if n in states else 0.0
        for n in workers
        for i in lms
    }
    running: dict[tuple[str, str], Mode] = {}
    for n in workers:
        if n in states:
            for inst in states[n].instances:
                running[(n, inst.lm)] = inst.mode
    demand = {i: sum(backlog[(n, i)] for n in workers) for i in lms}
    for _, i, k in batches:
        demand[i] += k
    prompts_in_play = max(sum(demand.values()), 1.0)

    allowed = allowed_modes(ctx, w.cpu_modes)
    per_prompt = {(i, m): service_s(ctx, i, m) for i in lms for m in ("gpu", "cpu")}

    v, rows = _Vars(), _Rows()
    delay_scale = w.lam / (tau * prompts_in_play)
    y: dict[tuple[str, str, Mode], int] = {}
    z_terms: dict[tuple[str, str], list[int]] = {}
    for n in workers:
        for i in lms:
            for m in allowed[n, i]:
                y[(n, i, m)] = v.add(0.0, 0.0, 1.0, True)
                z_terms.setdefault((n, i), []).append(y[(n, i, m)])
    n_pairs_total = max(len(workers) * len(lms), 1)
    constant = 0.0
    for (n, i), cols in z_terms.items():
        rows.add([(c, 1.0) for c in cols], 0.0, 1.0)
        # Stranded backlog: tau Q (1 - z); transition: |z - z0| with z0 a constant.
        stranded = delay_scale * tau * backlog[(n, i)]
        constant += stranded
        was = (n, i) in running
        trans = w.transition_weight / n_pairs_total
        constant += trans if was else 0.0
        for c in cols:
            v.cost[c] += -stranded + (-trans if was else trans)
    on_node: dict[str, list[tuple[str, Mode, int]]] = {}
    of_lm: dict[str, list[tuple[Mode, int]]] = {}
    for (n, i, m), c in y.items():  # grouped once, in y's order
        on_node.setdefault(n, []).append((i, m, c))
        of_lm.setdefault(i, []).append((m, c))
    for n in workers:
        spec = ctx.node(n).spec
        cores, mem, gpus, vram = [], [], [], []
        for i, m, c in on_node.get(n, ()):
            s = ctx.service(i).spec
            cores.append((c, s.default_cpu_cores))
            mem.append((c, s.deployment_memory_gib))
            if m == "gpu":
                gpus.append((c, 1.0))
                vram.append((c, s.min_vram_gib))
        for terms, cap in (
            (cores, spec.cpu_cores),
            (mem, spec.memory_gib),
            (gpus, float(spec.total_vgpus)),
            (vram, spec.total_vram_gib),
        ):
            if terms:
                rows.add(terms, -np.inf, cap)
    u: dict[tuple[int, str, Mode], int] = {}
    slack_of: dict[int, int] = {}
    load: dict[tuple[str, str, Mode], list[tuple[int, float]]] = {}
    # Per LM, its (node, mode) options in order, with the slot's cold start and
    # backlog wait per option; per (origin, LM), the links to them (kept across slots).
    per_lm: dict[str, tuple[list[tuple[str, Mode]], np.ndarray, np.ndarray]] = {}
    link_memo: dict[tuple[str, str, bool], tuple[np.ndarray, np.ndarray]] = ctx.memo.setdefault(
        "milp.option_links", {}
    )
    for b, (o, i, k) in enumerate(batches):
        choice = []
        lm_options = per_lm.get(i)
        if lm_options is None:
            opts = [(n, m) for n in ctx.feasible_nodes(i) for m in allowed[n, i]]
            cold = np.array([0.0 if running.get((n, i)) == m else COLD_START_S for n, m in opts])
            wait = np.array([per_prompt[i, m] * (backlog[(n, i)] + 1) for n, m in opts])
            lm_options = per_lm[i] = (opts, cold, wait)
        opts, cold, wait = lm_options
        links = link_memo.get((o, i, w.cpu_modes))
        if links is None:
            links = link_memo[o, i, w.cpu_modes] = link_arrays(ctx, o, [n for n, _ in opts])
        # D_bnm, term for term as transfer_s(o, n, i, k) / k + cold + s_im (Q_ni + 1)
        delay = (links[0] + transfer_bits(ctx, i, k) / links[1]) / k + cold + wait
        picked: list[int] = list(range(len(opts)))
        if w.candidates is not None:
            ranked = np.argsort(delay, kind="stable").tolist()
            picked = ranked[: w.candidates]
            seed_dest = seed_plan[0].get((o, i)) if seed_plan is not None else None
            if seed_dest is not None and seed_plan is not None:
                mode = seed_plan[1][seed_dest].by_lm()[i].mode
                picked += [j for j in ranked[w.candidates :] if opts[j] == (seed_dest, mode)]
        options = [(float(delay[j]), *opts[j]) for j in picked]
        for d, n, m in options:
            col = v.add(delay_scale * k * d, 0.0, 1.0, True)
            u[(b, n, m)] = col
            choice.append((col, 1.0))
            rows.add([(col, 1.0), (y[(n, i, m)], -1.0)], -np.inf, 0.0)
            load.setdefault((n, i, m), []).append((col, float(k)))
        if choice and w.candidates is not None:
            # bounded model: a batch may stay unplaced at the price of waiting tau (a
            # failure), as the greedy plan leaves what fits nowhere, so it stays feasible
            slack = slack_of[b] = v.add(delay_scale * k * tau, 0.0, 1.0, False)
            rows.add([*choice, (slack, 1.0)], 1.0, 1.0)
        elif choice:
            rows.add(choice, 1.0, 1.0)
        # else: no allowed mode anywhere (a text LM on CPU-only nodes with cpu_modes off):
        # the batch is left to the router's nearest-node fallback.
    congestion: list[tuple[int, float, list[tuple[int, float]]]] = []
    for (_n, i, m), terms in load.items():
        per = service_s(ctx, i, m)
        wc = v.add(delay_scale, 0.0, np.inf, False)
        congestion.append((wc, per, terms))
        for l0 in TANGENTS:
            # W >= per * (l0 * L - l0^2 / 2)  <=>  per*l0*L - W <= per*l0^2/2
            rows.add(
                [(c, per * l0 * k) for c, k in terms] + [(wc, -1.0)], -np.inf, per * l0 * l0 / 2
            )
    served = [i for i in lms if demand[i] > 0]
    rho: dict[str, int] = {}
    differences: list[tuple[int, str, str]] = []
    if served:
        fair = 1.0 - w.lam
        for i in served:
            rho[i] = v.add(-fair * w.service_weight / len(served), 0.0, 1.0, False)
            constant += fair * w.service_weight / len(served)
            terms = [(rho[i], demand[i])]
            for m, c in of_lm.get(i, ()):
                terms.append((c, -ctx.loop.slot_s / per_prompt[i, m]))
            rows.add(terms, -np.inf, 0.0)
        pairs = list(itertools.combinations(served, 2))
        for a, b2 in pairs:
            dcol = v.add(fair / len(pairs), 0.0, np.inf, False)
            differences.append((dcol, a, b2))
            rows.add([(dcol, 1.0), (rho[a], -1.0), (rho[b2], 1.0)], 0.0, np.inf)
            rows.add([(dcol, 1.0), (rho[a], 1.0), (rho[b2], -1.0)], 0.0, np.inf)
    matrix = coo_matrix(
        (rows.vals, (rows.rows, rows.cols)), shape=(len(rows.lower), len(v.cost))
    ).tocsc()
    return _SlotModel(
        ctx,
        workers,
        lms,
        batches,
        demand,
        allowed,
        v,
        rows,
        constant,
        matrix,
        y,
        u,
        slack_of,
        congestion,
        rho,
        of_lm,
        differences,
    )


def _solve(
    model: _SlotModel, w: SurrogateWeights, seed_plan: SeedPlan | None = None
) -> tuple[_Result, float | None]:
    """Solve `model` with HiGHS within `w`'s limits, from `seed_plan`'s point when it
    is one of the model's feasible points; the result and the seed plan's objective."""
    v, rows, matrix, constant = model.v, model.rows, model.matrix, model.constant
    point: np.ndarray | None = None
    seed_value: float | None = None
    if seed_plan is not None:
        # The greedy plan is one of the model's feasible points: HiGHS starts from it,
        # so whatever its time limit, it returns a plan no worse, with a bound.
        point = _seed_point(seed_plan, model)
        if point is not None and _feasible(point, matrix, rows, v):
            seed_value = float(np.dot(v.cost, point)) + constant
        else:
            point = None
    limit_s = w.time_limit_s
    if w.deadline is not None:
        limit_s = max(min(limit_s, w.deadline - time.perf_counter()), 1e-6)
    res = _highs(matrix, rows, v, constant, replace(w, time_limit_s=limit_s), point)
    return res, seed_value


def _decode(
    obs: SlotObservation,
    w: SurrogateWeights,
    model: _SlotModel,
    res: _Result,
    seed_plan: SeedPlan | None,
    seed_value: float | None,
) -> Solution:
    """The plan of HiGHS's point: each batch's destination and each worker's placement;
    the seed plan when HiGHS kept it, a greedy plan when it found no point at all."""
    ctx = obs.context
    workers, lms, batches, allowed, v, y, u = (
        model.workers,
        model.lms,
        model.batches,
        model.allowed,
        model.v,
        model.y,
        model.u,
    )
    if res.x is None:
        # No feasible point in the time limit: a greedy plan, never "keep what runs"
        # (on a cold cluster that is nothing, and nothing would ever be served).
        dest_g, placements_g = seed_plan or greedy_slot(obs, w.cpu_modes)
        return Solution(
            dest_g,
            placements_g,
            status=f"solver time limit, no incumbent ({res.message}): greedy plan",
            variables=len(v.cost),
            source="greedy",
        )
    if (
        seed_plan is not None
        and seed_value is not None
        and res.objective >= seed_value - 1e-9
        and not res.optimal
    ):
        # HiGHS kept the plan it started from (its time limit hit before it found a
        # better one): the greedy plan, with HiGHS's bound on it.
        return Solution(
            seed_plan[0],
            seed_plan[1],
            status=f"greedy plan {seed_value:.4g}, no better one found ({res.message})",
            objective=seed_value,
            variables=len(v.cost),
            source="greedy",
            gap=_gap(seed_value, res.bound),
            start_objective=seed_value,
        )
    x = res.x
    dest: dict[tuple[str, str], str] = {}
    picks: dict[int, list[tuple[float, str]]] = {}
    for (b, n, _m), c in u.items():  # one pass, not one per batch
        picks.setdefault(b, []).append((x[c], n))
    for b, (o, i, _) in enumerate(batches):
        best = max(picks[b]) if b in picks else None
        if best is not None and best[0] > 0.5:  # else unplaced (bounded model): the fallback
            dest[(o, i)] = best[1]
    placements = {}
    for n in workers:
        lms_out = []
        for i in lms:
            active = [m for m in allowed[n, i] if x[y[(n, i, m)]] > 0.5]
            lm_cores = ctx.service(i).spec.default_cpu_cores
            if active and active[0] == "gpu":
                lms_out.append(LMPlacement(lm=i, mode="gpu", cpu_cores=lm_cores, vgpus=1))
            elif active:
                lms_out.append(LMPlacement(lm=i, mode="cpu", cpu_cores=lm_cores, vgpus=0))
            else:
                lms_out.append(LMPlacement(lm=i, mode="off", cpu_cores=0, vgpus=0))
        placements[n] = Placement(node=n, lms=lms_out)
    status = "optimal" if res.optimal else f"incumbent ({res.message})"
    return Solution(
        dest,
        placements,
        status,
        res.objective,
        len(v.cost),
        gap=_gap(res.objective, res.bound),
        start_objective=seed_value,
    )


@dataclass(frozen=True)
class _Result:
    x: np.ndarray | None
    objective: float
    bound: float
    optimal: bool
    message: str


def _highs(
    matrix: Any, rows: _Rows, v: _Vars, constant: float, w: SurrogateWeights, start: Any
) -> _Result:
    """Solve the model with HiGHS (objective with its constant, so the gap is the true
    one), from the feasible point `start` when given."""
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = matrix.shape[1], matrix.shape[0]
    lp.offset_ = constant
    lp.col_cost_ = np.asarray(v.cost, dtype=float)
    lp.col_lower_ = np.asarray(v.lower, dtype=float)
    lp.col_upper_ = np.asarray(v.upper, dtype=float)
    lp.row_lower_ = np.asarray(rows.lower, dtype=float)
    lp.row_upper_ = np.asarray(rows.upper, dtype=float)
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = matrix.indptr
    lp.a_matrix_.index_ = matrix.indices
    lp.a_matrix_.value_ = matrix.data
    integer, continuous = highspy.HighsVarType.kInteger, highspy.HighsVarType.kContinuous
    lp.integrality_ = [integer if k else continuous for k in v.integer]
    h = _Highs()
    for name, value in (
        ("output_flag", False),
        ("threads", 1),  # on the caller's thread: its CPU time is the slot's cost
        ("time_limit", w.time_limit_s),
        ("mip_rel_gap", w.mip_gap),
    ):
        h.setOptionValue(name, value)
    h.passModel(lp)
    if start is not None:
        sol = highspy.HighsSolution()
        sol.col_value = start.tolist()
        sol.value_valid = True
        h.setSolution(sol)
    h.run()
    status = h.getModelStatus()
    info = h.getInfo()
    feasible = info.primal_solution_status == 2  # kSolutionStatusFeasible
    x = np.asarray(h.getSolution().col_value) if feasible else None
    return _Result(
        x,
        float(info.objective_function_value),
        float(info.mip_dual_bound),
        status == highspy.HighsModelStatus.kOptimal,
        h.modelStatusToString(status),
    )


def _gap(objective: float, bound: float) -> float | None:
    """The relative gap (objective - bound) / objective; None without a bound.

    Every term of the surrogate is nonnegative, so 0 bounds it too: an early dual
    bound below 0 (an LP relaxation cut short) gives a gap of 1, not more.
    """
    if not np.isfinite(bound):
        return None
    return abs(objective - max(bound, 0.0)) / max(abs(objective), 1e-12)


def _seed_point(seed_plan: SeedPlan, model: _SlotModel) -> np.ndarray | None:
    """The model's point of the greedy plan, continuous columns at their least cost;
    None when the plan is not a point of this model (a destination it does not offer)."""
    dest, placements = seed_plan
    batches, y, u, slack_of = model.batches, model.y, model.u, model.slack_of
    congestion, rho, of_lm = model.congestion, model.rho, model.of_lm
    differences, demand, ctx, size = model.differences, model.demand, model.ctx, len(model.v.cost)
    by_lm = {n: p.by_lm() for n, p in placements.items()}
    x = np.zeros(size)
    for (n, i, m), c in y.items():
        lp = by_lm.get(n, {}).get(i)
        x[c] = 1.0 if lp is not None and lp.mode == m else 0.0
    for b, (o, i, _k) in enumerate(batches):
        to = dest.get((o, i))
        lp = by_lm.get(to, {}).get(i) if to is not None else None
        col = u.get((b, to, lp.mode)) if to is not None and lp is not None else None
        if col is not None:
            x[col] = 1.0
        elif b in slack_of:
            x[slack_of[b]] = 1.0
        else:
            return None
    for wc, per, terms in congestion:
        load = sum(k * x[c] for c, k in terms)
        x[wc] = max(0.0, *(per * (l0 * load - l0 * l0 / 2) for l0 in TANGENTS))
    for i, col in rho.items():
        capacity = sum(ctx.loop.slot_s / service_s(ctx, i, m) * x[c] for m, c in of_lm.get(i, ()))
        x[col] = min(1.0, capacity / demand[i])
    for dcol, a, b2 in differences:
        x[dcol] = abs(x[rho[a]] - x[rho[b2]])
    return x


def _feasible(x: np.ndarray, matrix: Any, rows: _Rows, v: _Vars) -> bool:
    """`x` within the model's rows and bounds (to a 1e-7 tolerance)."""
    r = matrix @ x
    tol = 1e-7
    return bool(
        np.all(r >= np.array(rows.lower) - tol)
        and np.all(r <= np.array(rows.upper) + tol)
        and np.all(x >= np.array(v.lower) - tol)
        and np.all(x <= np.array(v.upper) + tol)
    )
