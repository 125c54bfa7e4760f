"""Request-level statistics of the reproduction: objective J over any set of requests,
rolling windows with bootstrap confidence intervals, arrivals per LM.

A run summary aggregates requests into windows; Figs. 8 and 9 need the
requests themselves (a bootstrap resamples them), so these work on the
`RequestTable` columns a run sends back, pooled over seeds. Everything is
deterministic: the bootstrap's generator is seeded per window.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from lmedge.bench.runner import RequestTable

FloatArray = npt.NDArray[np.float64]

#: Rolling objective (Figs. 8, 9): trailing span and step, in slots. 30 slots
#: (15 minutes) hold ~600 requests on the testbed, enough for a stable J.
ROLLING_SPAN_SLOTS = 30
ROLLING_STEP_SLOTS = 10
#: Bootstrap resamples per window, and the interval's coverage.
BOOTSTRAP_RESAMPLES = 1000
CI_LEVEL = 0.95


def objectives(
    lm: npt.NDArray[np.int64],
    success: npt.NDArray[np.bool_],
    t_over_deadline: FloatArray,
    lms: int,
    lam: float,
    samples: npt.NDArray[np.int64] | None = None,
) -> FloatArray:
    """J of the requests picked by each row of `samples` (all requests once if None).

    Vectorised `lmedge.metrics.window_metrics` objective, with its degenerate
    cases: LMs without arrivals are out of the Jain index; nothing served gives
    F_norm = 0 and T_norm = 1; a single LM type has F_norm = 1 when served.
    """
    idx = np.arange(len(lm))[None, :] if samples is None else samples
    picked_lm, ok, t = lm[idx], success[idx], t_over_deadline[idx]
    arrivals = np.stack([(picked_lm == k).sum(axis=1) for k in range(lms)], axis=1)
    served = np.stack([((picked_lm == k) & ok).sum(axis=1) for k in range(lms)], axis=1)
    present = arrivals > 0
    rho = np.where(present, served / np.maximum(arrivals, 1), 0.0)
    m = present.sum(axis=1).astype(float)
    s1, s2 = rho.sum(axis=1), (rho**2).sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        f = np.minimum(1.0, s1**2 / (m * s2))
        f_norm = np.where(m > 1, (f - 1.0 / m) / (1.0 - 1.0 / m), 1.0)
    f_norm = np.where(s2 > 0, np.clip(f_norm, 0.0, 1.0), 0.0)
    n_ok = ok.sum(axis=1)
    t_norm = np.where(n_ok > 0, (t * ok).sum(axis=1) / np.maximum(n_ok, 1), 1.0)
    out: FloatArray = lam * t_norm + (1.0 - lam) * (1.0 - f_norm)
    return out


@dataclass(frozen=True)
class Pooled:
    """Request columns of several runs (seeds) of one scenario and policy, as arrays."""

    slot: npt.NDArray[np.int64]
    lm: npt.NDArray[np.int64]
    prompts: npt.NDArray[np.int64]
    success: npt.NDArray[np.bool_]
    t_over_deadline: FloatArray
    lms: tuple[str, ...]
    lam: float
    runs: int

    @staticmethod
    def of(tables: Sequence[RequestTable], lam: float) -> Pooled:
        lms = tables[0].lms if tables else ()
        if any(t.lms != lms for t in tables):
            raise ValueError("runs of one scenario list different LMs")

        def cat(column: str, dtype: Any) -> Any:
            return np.asarray([x for t in tables for x in getattr(t, column)], dtype=dtype)

        latency, deadline = cat("latency_s", float), cat("deadline_s", float)
        return Pooled(
            slot=cat("slot", np.int64),
            lm=cat("lm", np.int64),
            prompts=cat("prompts", np.int64),
            success=cat("success", bool),
            t_over_deadline=latency / np.where(deadline > 0, deadline, 1.0),
            lms=lms,
            lam=lam,
            runs=len(tables),
        )

    def objective(self, start: int, end: int) -> float | None:
        """J over the requests of slots [start, end); None without requests."""
        sel = (self.slot >= start) & (self.slot < end)
        if not sel.any():
            return None
        return float(
            objectives(
                self.lm[sel], self.success[sel], self.t_over_deadline[sel], len(self.lms), self.lam
            )[0]
        )

    def rolling(self, slots: int, seed: int = 0) -> list[dict[str, float | None]]:
        """Trailing-window J every `ROLLING_STEP_SLOTS` slots with a percentile bootstrap CI.

        Deterministic: resample k of window ending at slot e uses a generator
        seeded by (seed, e), whatever else was computed before.
        """
        out: list[dict[str, float | None]] = []
        alpha = (1.0 - CI_LEVEL) / 2
        for end in range(ROLLING_STEP_SLOTS, slots + 1, ROLLING_STEP_SLOTS):
            start = max(0, end - ROLLING_SPAN_SLOTS)
            sel = np.flatnonzero((self.slot >= start) & (self.slot < end))
            if not len(sel):
                out.append({"end_slot": end, "objective": None, "lo": None, "hi": None})
                continue
            lm, ok, t = self.lm[sel], self.success[sel], self.t_over_deadline[sel]
            rng = np.random.default_rng([seed, end])
            samples = rng.integers(0, len(sel), size=(BOOTSTRAP_RESAMPLES, len(sel)))
            boot = objectives(lm, ok, t, len(self.lms), self.lam, samples)
            point = objectives(lm, ok, t, len(self.lms), self.lam)[0]
            lo, hi = np.quantile(boot, [alpha, 1.0 - alpha])
            out.append(
                {
                    "end_slot": end,
                    "objective": round(float(point), 6),
                    "lo": round(float(lo), 6),
                    "hi": round(float(hi), 6),
                }
            )
        return out

    def arrivals(self, slots: int, step: int, *, prompts: bool = True) -> dict[str, list[float]]:
        """Prompts (or requests) per slot by LM, averaged over each `step`-slot window and runs.

        Prompts by default: one request per (origin, LM, slot) at most, so a
        burst (more prompts per request) shows in prompts, not in requests.
        """
        windows = -(-slots // step)
        out: dict[str, list[float]] = {}
        for k, name in enumerate(self.lms):
            mine = self.lm == k
            weights = self.prompts[mine] if prompts else None
            counts = np.bincount(self.slot[mine] // step, weights=weights, minlength=windows)
            out[name] = [round(float(c) / (step * max(self.runs, 1)), 6) for c in counts[:windows]]
        return out
