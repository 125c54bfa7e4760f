"""Calibrating the Lyapunov deployer (paper §VI, Fig. 5): the pure half.

Two steps, as in the paper:

1. Service-rate weights from observed completions:

       mu_i^m = Gamma_i^m / sum_n sum_t 1{r_ni(t) = m, Q_ni(t) > 0} dt

   Gamma_i^m: prompts of LM i completed in mode m; the denominator counts the
   slots in which LM i ran in mode m on node n with a nonempty queue at the
   slot start, times the slot length. alpha_i^m = mu_i^m * slot_s (prompts per
   slot), the unit the deployer uses.

2. A deterministic log-space coordinate search over the DPP coefficients:
   from a generic positive start, for each radius r of a fixed sequence and
   each coefficient in a fixed order, evaluate x*r and x/r; accept the better
   candidate only if it lowers the objective by more than `eps_acc`. The
   objective (measured on validation windows by the caller's `evaluate`) is

       J_cal(x) = mean latency / tau + (1 - Jain over per-LM success) + mean flips

   with flips = activation changes per node-slot decision.

Running the validation windows needs the emulator, which lives above this
layer; `lmedge calibrate` (lmedge/cli/calibrate.py) supplies `evaluate`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from lmedge.api import Placement, RequestRecord, Snapshot
from lmedge.metrics import jain

#: The coefficients searched, in the paper's order.
COEFFICIENTS = ("p1", "p2", "lambda_churn", "kappa")


@dataclass(frozen=True)
class ServiceRates:
    """Estimated weights per LM and the evidence behind them."""

    alpha_gpu: dict[str, float]
    alpha_cpu: dict[str, float]
    completed: dict[tuple[str, str], int]
    busy_s: dict[tuple[str, str], float]


def service_rates(
    records: Sequence[RequestRecord], snapshots: Sequence[Snapshot], slot_s: float
) -> ServiceRates:
    """alpha_i^m = slot_s * completed prompts / busy seconds, per (LM, mode) observed."""
    completed: dict[tuple[str, str], int] = defaultdict(int)
    for r in records:
        if r.mode in ("gpu", "cpu"):
            completed[(r.lm, r.mode)] += r.prompts_done
    busy: dict[tuple[str, str], float] = defaultdict(float)
    for snap in snapshots:
        for node in snap.nodes:
            for inst in node.instances:
                if inst.status == "ready" and node.backlog.get(inst.lm, 0) > 0:
                    busy[(inst.lm, inst.mode)] += slot_s
    alpha: dict[str, dict[str, float]] = {"gpu": {}, "cpu": {}}
    for (lm, mode), secs in busy.items():
        if secs > 0:
            alpha[mode][lm] = slot_s * completed.get((lm, mode), 0) / secs
    return ServiceRates(alpha["gpu"], alpha["cpu"], dict(completed), dict(busy))


def flips_per_decision(placements: Sequence[Placement]) -> float:
    """Mean number of LMs whose activation changed, per node-slot decision."""
    last: dict[str, set[str]] = {}
    flips = decisions = 0
    for p in placements:
        active = set(p.active())
        if p.node in last:
            flips += len(active ^ last[p.node])
            decisions += 1
        last[p.node] = active
    return flips / decisions if decisions else 0.0


def calibration_objective(
    records: Sequence[RequestRecord],
    placements: Sequence[Placement],
    lms: Sequence[str],
    tau_s: float,
) -> float:
    """J_cal = mean latency / tau + (1 - Jain of per-LM success ratios) + mean flips.

    Timed-out requests count with latency tau (as in the paper's Table II), so a
    policy cannot look fast by letting requests expire.
    """
    if not records:
        return float("inf")
    latency = sum(min(r.latency_s, tau_s) if r.outcome == "success" else tau_s for r in records)
    arrivals: dict[str, int] = defaultdict(int)
    ok: dict[str, int] = defaultdict(int)
    for r in records:
        arrivals[r.lm] += 1
        ok[r.lm] += r.outcome == "success"
    ratios = [ok[lm] / arrivals[lm] for lm in lms if arrivals[lm]]
    fairness = jain(ratios)
    return (
        latency / len(records) / tau_s
        + (1.0 - (fairness if fairness is not None else 0.0))
        + flips_per_decision(placements)
    )


@dataclass(frozen=True)
class SearchStep:
    """One coordinate trial: the current point, both candidates, what was kept."""

    radius: float
    coefficient: str
    current: float
    j_current: float
    j_up: float
    j_down: float
    accepted: str  # "up", "down" or "keep"
    point: dict[str, float]


@dataclass
class SearchResult:
    start: dict[str, float]
    final: dict[str, float]
    j_start: float
    j_final: float
    steps: list[SearchStep] = field(default_factory=list)
    evaluations: int = 0


def coordinate_search(
    evaluate: Callable[[Mapping[str, float]], float],
    start: Mapping[str, float],
    radii: Sequence[float] = (2.0,),
    eps_acc: float = 0.01,
    order: Sequence[str] = COEFFICIENTS,
    on_step: Callable[[SearchStep], None] | None = None,
) -> SearchResult:
    """Deterministic log-space coordinate search with an acceptance margin."""
    x = dict(start)
    cache: dict[tuple[tuple[str, float], ...], float] = {}

    def j(point: Mapping[str, float]) -> float:
        key = tuple(sorted((k, round(v, 12)) for k, v in point.items()))
        if key not in cache:
            cache[key] = evaluate(point)
        return cache[key]

    result = SearchResult(start=dict(x), final=x, j_start=j(x), j_final=0.0)
    for r in radii:
        for c in order:
            j_now = j(x)
            up, down = dict(x), dict(x)
            up[c], down[c] = x[c] * r, x[c] / r
            j_up, j_down = j(up), j(down)
            name, point, j_best = ("up", up, j_up) if j_up <= j_down else ("down", down, j_down)
            current = x[c]
            accepted = name if j_best < j_now - eps_acc else "keep"
            if accepted != "keep":
                x = point
            step = SearchStep(r, c, current, j_now, j_up, j_down, accepted, dict(x))
            result.steps.append(step)
            if on_step:
                on_step(step)
    result.final = dict(x)
    result.j_final = j(x)
    result.evaluations = len(cache)
    return result
