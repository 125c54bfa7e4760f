"""The summary of one run: the numbers `lmedge simulate --json` prints and reports tabulate.

Deterministic by construction: it is a function of the run's records,
decisions and placements only (never of wall-clock time; a `RunTally` folds
them in as the run goes, so no history need be kept), floats are rounded
to `DIGITS` decimals so the JSON is stable across platforms' last-bit
differences, and keys come out in a fixed order. Wall-clock measurements live
in `timing_summary`, kept apart so golden files can compare summaries exactly.

All metric definitions are `lmedge.metrics`'; this module only selects and
shapes them.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterable, Mapping
from typing import Any, cast

from lmedge.api.records import RequestRecord
from lmedge.api.totals import WindowTotals
from lmedge.bench.tally import QuantileTally, RunTally, TokenTally
from lmedge.controller.loop import RunResult
from lmedge.metrics import (
    BALANCE_EPSILON,
    LoadBalanceStats,
    lm_mean_penalized_latency,
    lms_named,
    load_balance_stats,
    penalized_latency,
    share,
)

#: Decimals kept in summaries (6: sub-microsecond latencies, ratios to 1e-6).
DIGITS = 6
#: Slots per window of the per-window series (box plots, rolling objective).
#: 10 slots (5 minutes) gives 20 windows in a 200-slot run; the epoch (50
#: slots) would give only 4, too few for a distribution.
WINDOW_SLOTS = 10


def rounded(value: Any) -> Any:
    """`value` with every float rounded to `DIGITS` decimals (NaN/inf become None)."""
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return None
        r = round(value, DIGITS)
        return 0.0 if r == 0 else r
    if isinstance(value, dict):
        return {k: rounded(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [rounded(v) for v in value]
    return value


def summarize(
    result: RunResult,
    tally: RunTally | None = None,
    *,
    scenario: str,
    seed: int,
    components: dict[str, str] | None = None,
    window_slots: int = WINDOW_SLOTS,
    kv_gib_s: dict[str, float] | None = None,
) -> dict[str, Any]:
    """The deterministic summary of `result` (see the module docstring).

    `tally` followed the run as it went (`RunTally`, made with the same
    `window_slots`); without one the result's kept history is replayed
    into one. A run with token-level records (token-engine LMs) also gets
    `tokens` (`token_summary`); `kv_gib_s` is its per-node KV memory-time.
    """
    if tally is None:
        tally = RunTally.replay(result, window_slots)
    ctx = tally.ctx
    seg = tally.segment.metrics(lms_named(ctx, tally.segment.overall.names))
    o = seg.overall
    deadlines = tally.segment.overall.lm_deadlines(o.per_lm)
    bounds = tally.bounds.bounds([s.lm for s in o.per_lm])
    # Table III counts what was actuated (started / stopped / resized), not what was decided.
    reconf = tally.reconfiguration.stats()
    conflicts = tally.conflicts.stats()
    tally.stranded.close()
    summary: dict[str, Any] = {
        "scenario": scenario,
        "policy": result.policy,
        "components": components or {},
        "seed": seed,
        "slots": result.slots,
        "settle_slots": result.settle_slots,
        "objective": o.objective,
        "jain": o.jain,
        "f_norm": o.f_norm,
        "t_norm": o.t_norm,
        "mean_latency_s": o.mean_latency_s,
        # the paper's headline latency: unweighted mean of the per-LM means (lmedge.metrics)
        "lm_mean_latency_s": o.lm_mean_latency_s,
        # the same with every failed request at its deadline: refusing work cannot lower it
        "lm_mean_penalized_latency_s": lm_mean_penalized_latency(o.per_lm, deadlines),
        "success_ratio": o.successes / o.requests if o.requests else None,
        "requests": o.requests,
        "successes": o.successes,
        # refused by admission control: failures, part of `requests` (lmedge.metrics)
        "rejected": o.rejected,
        "rejected_ratio": share(o.rejected, o.requests),
        # every request ends in exactly one outcome; all but success are failures
        "outcomes": dict(tally.outcomes),
        "per_lm": [
            {
                **s.model_dump(),
                "rejected_ratio": share(s.rejected, s.arrivals),
                # no-queue, no-cold-start bound of mean_latency_s (servicemodel.lower_bounds)
                "lower_bound_s": bounds[s.lm],
                "penalized_latency_s": penalized_latency(s, deadlines[s.lm]),
            }
            for s in o.per_lm
        ],
        "window_slots": window_slots,
        "window_mean_jain": seg.window_mean_jain,
        "window_mean_latency_s": seg.window_mean_latency_s,
        "window_mean_lm_mean_latency_s": seg.window_mean_lm_mean_latency_s,
        "window_mean_lm_mean_penalized_latency_s": _mean(
            lm_mean_penalized_latency(w.per_lm, deadlines) for w in seg.windows
        ),
        "window_mean_objective": seg.window_mean_objective,
        "windows": [
            {
                "start_slot": i * window_slots,
                "requests": w.requests,
                "jain": w.jain,
                "mean_latency_s": w.mean_latency_s,
                "lm_mean_latency_s": w.lm_mean_latency_s,
                "lm_mean_penalized_latency_s": lm_mean_penalized_latency(w.per_lm, deadlines),
                "objective": w.objective,
                "success_ratio": w.successes / w.requests if w.requests else None,
                "rejected": w.rejected,
                "rejected_ratio": share(w.rejected, w.requests),
            }
            for i, w in enumerate(seg.windows)
        ],
        "conflicts": conflicts.model_dump(),
        # timed out at a node where their LM never ran before the deadline (metrics.py)
        "stranded": tally.stranded.count,
        "reconfiguration": {
            "decisions": reconf.decisions,
            "activations_per_100": reconf.total.activations_per_100,
            "deactivations_per_100": reconf.total.deactivations_per_100,
            "resizes_per_100": reconf.total.resizes_per_100,
            "set_change_ratio": reconf.set_change_ratio,
            "per_lm": [r.model_dump() for r in reconf.per_lm],
        },
        "audit": [a.model_dump() for a in tally.audit.counts()],
        "epochs": [
            {"epoch": i, "objective": e.objective, "jain": e.jain, "requests": e.requests}
            for i, e in enumerate(result.epochs)
        ],
    }
    if tally.tokens:
        summary["tokens"] = {
            "per_lm": tally.tokens.per_lm(),
            "kv_gib_s": dict(sorted((kv_gib_s or {}).items())),
        }
    return cast(dict[str, Any], rounded(summary))


def token_summary(records: list[RequestRecord], kv_gib_s: dict[str, float]) -> dict[str, Any]:
    """Per serving LM, TTFT and TPOT (mean, P50, P99) of its successful token-level
    requests and their mean tokens; per node, KV memory-time (GiB-seconds)."""
    tokens = TokenTally()
    for r in records:
        tokens.add(r)
    return {"per_lm": tokens.per_lm(), "kv_gib_s": dict(sorted(kv_gib_s.items()))}


def balance_summary(
    tally: RunTally,
    kv_samples: list[dict[str, tuple[float, float]]],
    *,
    epsilon: float = BALANCE_EPSILON,
) -> dict[str, Any]:
    """LYREO's metrics of a token-level run: mean and P99 end-to-end latency of its
    successful measured requests, and the load deviation Y, virtual-queue length Z
    and high-KV share (`lmedge.metrics.load_balance_stats`) over its measured slots.

    `kv_samples` is the emulator's reading at every slot boundary
    (`Emulator.kv_samples`); a server's memory-time capacity is its GPU memory
    (memory on a CPU-only node), over the servers that ran a token engine.
    """
    lb = balance_stats(tally, kv_samples, epsilon=epsilon)
    return cast(
        dict[str, Any],
        rounded(
            {
                "mean_latency_s": tally.success_latency.mean(),
                "p99_latency_s": tally.success_latency.quantile(0.99),
                **lb.model_dump(),
            }
        ),
    )


def balance_stats(
    tally: RunTally,
    kv_samples: list[dict[str, tuple[float, float]]],
    *,
    epsilon: float = BALANCE_EPSILON,
) -> LoadBalanceStats:
    """Y, Z and the high-KV share of `balance_summary` (over the measured slots)."""
    ctx = tally.ctx
    servers = sorted({s for sample in kv_samples for s in sample})
    capacity = {}
    for s in servers:
        spec = ctx.node(s).spec if ctx.has_node(s) else None
        if spec is not None:
            capacity[s] = (spec.total_vram_gib if spec.has_gpu else spec.memory_gib) * 1024**3
    return load_balance_stats(kv_samples[: tally.slots + 1], capacity, ctx.loop.slot_s, epsilon)


def routing_summary(
    energy: QuantileTally, windows: Mapping[str, float] | None = None
) -> dict[str, Any]:
    """The run's emulated energy (`RequestRecord.energy_j`, summed as the run goes) and, for a
    request-level router that keeps `window_totals` (CEMA's request mode and
    its baselines), the means of its windows' J, the seed's J, raw quality
    loss and makespan, and its total modelled cost and energy."""
    out: dict[str, Any] = {
        "energy_j": energy.total,
        "energy_j_per_request": energy.mean(),
    }
    terms = reported_terms(windows)
    if terms is not None and windows:
        out["windows"] = {
            "windows": int(windows["windows"]),
            "requests": int(windows["requests"]),
            **terms,
        }
    return cast(dict[str, Any], rounded(out))


def reported_terms(windows: Mapping[str, float] | None) -> dict[str, float] | None:
    """The means and totals of the terms a request-level router summed over its windows
    (`window_totals`: CEMA's `window_totals`); None when it kept none or routed none."""
    if not windows or not windows.get("windows"):
        return None
    n = windows["windows"]
    return {
        "j_mean": windows["j"] / n,
        "seed_j_mean": windows["seed_j"] / n,
        "quality_loss_mean": windows["quality_loss"] / n,
        "cost": windows["cost"],
        "energy_j": windows["energy"],
        "makespan_s_mean": windows["makespan"] / n,
    }


def window_totals(
    stats: Mapping[str, float], reported: Mapping[str, float] | None
) -> WindowTotals | None:
    """An emulated run's `WindowTotals`: the emulator's count of the windows it routed
    (`Emulator.window_stats`: windows, requests, fallbacks, wall seconds deciding) and
    the terms the router reported (`reported_terms`); None when no window was routed."""
    windows = int(stats.get("windows", 0))
    if not windows:
        return None
    terms = reported_terms(reported) or {}
    return WindowTotals(
        windows=windows,
        requests=int(stats["requests"]) if "requests" in stats else None,
        fallbacks=int(stats["fallbacks"]) if "fallbacks" in stats else None,
        decision_s_mean=stats["decision_s"] / windows if "decision_s" in stats else None,
        reported=int(reported["windows"]) if terms and reported else 0,
        **rounded(terms),
    )


def _mean(values: Iterable[float | None]) -> float | None:
    xs = [v for v in values if v is not None]
    return sum(xs) / len(xs) if xs else None


def timing_summary(result: RunResult | RunTally, wall_s: float) -> dict[str, Any]:
    """Wall-clock figures of a run; they differ between runs, so they stay out of summaries.

    From the tally that followed the run, or the timings a result kept.
    """
    if isinstance(result, RunTally):
        decide, store_s = list(result.decide_s), result.store_s
    else:
        decide, store_s = (
            [t.decide_s for t in result.timings],
            sum(t.store_s for t in result.timings),
        )
    return cast(
        dict[str, Any],
        rounded(
            {
                "wall_s": wall_s,
                "slots_run": len(decide),
                "decide_s_per_slot_mean": statistics.fmean(decide) if decide else None,
                "decide_s_per_slot_p95": _quantile(decide, 0.95),
                "decide_s_per_slot_max": max(decide, default=None),
                "store_s_total": store_s,
            }
        ),
    )


def _quantile(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, math.ceil(q * len(s)) - 1)]


def dumps(summary: dict[str, Any]) -> str:
    """The canonical JSON text of a summary (what `--json` prints and goldens hold)."""
    return json.dumps(summary, indent=2, ensure_ascii=False, allow_nan=False) + "\n"
