"""The summary of one run: the numbers `lmedge simulate --json` prints and reports tabulate.

Deterministic by construction: it is a function of the run's records,
decisions and placements only (never of wall-clock time), floats are rounded
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
from collections.abc import Mapping
from typing import Any, cast, get_args

from lmedge.api.records import RequestOutcome, RequestRecord
from lmedge.controller.loop import RunResult
from lmedge.metrics import (
    audit_counts,
    conflict_stats,
    metric_lms,
    reconfiguration_stats,
    segment_metrics,
    share,
    stranded_requests,
)
from lmedge.sim.servicemodel import lower_bounds

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
    *,
    scenario: str,
    seed: int,
    components: dict[str, str] | None = None,
    window_slots: int = WINDOW_SLOTS,
    kv_gib_s: dict[str, float] | None = None,
) -> dict[str, Any]:
    """The deterministic summary of `result` (see the module docstring).

    A run with token-level records (token-engine LMs) also gets `tokens`
    (`token_summary`); `kv_gib_s` is its per-node KV memory-time.
    """
    ctx = result.context
    deadlines = {lm: ctx.deadline_s(lm) for lm in ctx.lm_names}
    records = result.measured_records()
    seg = segment_metrics(
        records,
        metric_lms(ctx, records),
        window_slots,
        start_slot=0,
        end_slot=result.slots,
        tau_s=ctx.loop.tau_s,
        lam=ctx.loop.lam,
        deadlines=deadlines,
    )
    o = seg.overall
    bounds = lower_bounds(ctx, records, [s.lm for s in o.per_lm])
    # Table III counts what was actuated (started / stopped / resized), not what was decided.
    measured = [
        a
        for a, slot in zip(result.actuations, result.placement_slots, strict=True)
        if slot < result.slots
    ]
    reconf = reconfiguration_stats(measured, ctx.lm_names)
    conflicts = conflict_stats(records, tau_s=ctx.loop.tau_s, deadlines=deadlines)
    decisions = [d for d in result.decisions if d.slot < result.slots]
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
        "success_ratio": o.successes / o.requests if o.requests else None,
        "requests": o.requests,
        "successes": o.successes,
        # refused by admission control: failures, part of `requests` (lmedge.metrics)
        "rejected": o.rejected,
        "rejected_ratio": share(o.rejected, o.requests),
        # every request ends in exactly one outcome; all but success are failures
        "outcomes": _outcomes(records),
        "per_lm": [
            {
                **s.model_dump(),
                "rejected_ratio": share(s.rejected, s.arrivals),
                # no-queue, no-cold-start bound of mean_latency_s (servicemodel.lower_bounds)
                "lower_bound_s": bounds[s.lm],
            }
            for s in o.per_lm
        ],
        "window_slots": window_slots,
        "window_mean_jain": seg.window_mean_jain,
        "window_mean_latency_s": seg.window_mean_latency_s,
        "window_mean_lm_mean_latency_s": seg.window_mean_lm_mean_latency_s,
        "window_mean_objective": seg.window_mean_objective,
        "windows": [
            {
                "start_slot": i * window_slots,
                "requests": w.requests,
                "jain": w.jain,
                "mean_latency_s": w.mean_latency_s,
                "lm_mean_latency_s": w.lm_mean_latency_s,
                "objective": w.objective,
                "success_ratio": w.successes / w.requests if w.requests else None,
                "rejected": w.rejected,
                "rejected_ratio": share(w.rejected, w.requests),
            }
            for i, w in enumerate(seg.windows)
        ],
        "conflicts": conflicts.model_dump(),
        # timed out at a node where their LM never ran before the deadline (metrics.py)
        "stranded": len(
            stranded_requests(
                records, result.actuations, result.placement_slots, deadlines, ctx.loop.slot_s
            )
        ),
        "reconfiguration": {
            "decisions": reconf.decisions,
            "activations_per_100": reconf.total.activations_per_100,
            "deactivations_per_100": reconf.total.deactivations_per_100,
            "resizes_per_100": reconf.total.resizes_per_100,
            "set_change_ratio": reconf.set_change_ratio,
            "per_lm": [r.model_dump() for r in reconf.per_lm],
        },
        "audit": [a.model_dump() for a in audit_counts(decisions)],
        "epochs": [
            {"epoch": i, "objective": e.objective, "jain": e.jain, "requests": e.requests}
            for i, e in enumerate(result.epochs)
        ],
    }
    if any(r.output_tokens is not None for r in records):
        summary["tokens"] = token_summary(records, kv_gib_s or {})
    return cast(dict[str, Any], rounded(summary))


def token_summary(records: list[RequestRecord], kv_gib_s: dict[str, float]) -> dict[str, Any]:
    """Per serving LM, TTFT and TPOT (mean, P50, P99) of its successful token-level
    requests and their mean tokens; per node, KV memory-time (GiB-seconds)."""
    by_lm: dict[str, list[RequestRecord]] = {}
    for r in records:
        if r.output_tokens is not None:
            by_lm.setdefault(r.model or r.lm, []).append(r)
    per_lm = []
    for lm, rs in by_lm.items():
        ok = [r for r in rs if r.outcome == "success" and r.ttft_s is not None]
        ttft = [r.ttft_s for r in ok if r.ttft_s is not None]
        tpot = [r.tpot_s for r in ok if r.tpot_s is not None]
        per_lm.append(
            {
                "lm": lm,
                "requests": len(rs),
                "successes": len(ok),
                "input_tokens_mean": statistics.fmean(r.input_tokens or 0 for r in rs),
                "output_tokens_mean": statistics.fmean(r.output_tokens or 0 for r in rs),
                **_stats("ttft_s", ttft),
                **_stats("tpot_s", tpot),
            }
        )
    return {"per_lm": per_lm, "kv_gib_s": dict(sorted(kv_gib_s.items()))}


def routing_summary(
    records: list[RequestRecord], windows: Mapping[str, float] | None = None
) -> dict[str, Any]:
    """The run's emulated energy (`RequestRecord.energy_j`, summed) and, for a
    request-level router that keeps `window_totals` (CEMA's request mode and
    its baselines), the means of its windows' J, the seed's J, raw quality
    loss and makespan, and its total modelled cost and energy."""
    energy = [r.energy_j for r in records if r.energy_j is not None]
    out: dict[str, Any] = {
        "energy_j": sum(energy),
        "energy_j_per_request": statistics.fmean(energy) if energy else None,
    }
    if windows and windows.get("windows"):
        n = windows["windows"]
        out["windows"] = {
            "windows": int(n),
            "requests": int(windows["requests"]),
            "j_mean": windows["j"] / n,
            "seed_j_mean": windows["seed_j"] / n,
            "quality_loss_mean": windows["quality_loss"] / n,
            "cost": windows["cost"],
            "energy_j": windows["energy"],
            "makespan_s_mean": windows["makespan"] / n,
        }
    return cast(dict[str, Any], rounded(out))


def _stats(name: str, xs: list[float]) -> dict[str, float | None]:
    return {
        f"{name}_mean": statistics.fmean(xs) if xs else None,
        f"{name}_p50": _quantile(xs, 0.5),
        f"{name}_p99": _quantile(xs, 0.99),
    }


def timing_summary(result: RunResult, wall_s: float) -> dict[str, Any]:
    """Wall-clock figures of a run; they differ between runs, so they stay out of summaries."""
    decide = [t.decide_s for t in result.timings]
    store = [t.store_s for t in result.timings]
    return cast(
        dict[str, Any],
        rounded(
            {
                "wall_s": wall_s,
                "slots_run": len(result.timings),
                "decide_s_per_slot_mean": statistics.fmean(decide) if decide else None,
                "decide_s_per_slot_p95": _quantile(decide, 0.95),
                "decide_s_per_slot_max": max(decide, default=None),
                "store_s_total": sum(store),
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


def _outcomes(records: list[RequestRecord]) -> dict[str, int]:
    """Records per outcome, every outcome named (0 when none), in `RequestOutcome` order."""
    out = dict.fromkeys(get_args(RequestOutcome), 0)
    for r in records:
        out[r.outcome] += 1
    return out
