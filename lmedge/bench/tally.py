"""A run's summary computed as the run goes, in memory that does not grow with its length.

`RunTally` follows the control loop (`lmedge.controller.loop.RunRecorder`):
every finished request, actuation and decision is folded into counters and
sums the moment the loop has it, and `lmedge.bench.summary.summarize` reads
them at the end. Nothing per request is kept, so a 1,000-worker run costs the
same memory at slot 10 as at slot 200. The arithmetic is `lmedge.metrics`'
(its tallies are the batch functions' own), in the same record order, so the
summary is the one the run's full history gives, to the last bit.

Two things are kept per item, both small and said where they are: the
token-level TTFT and TPOT of successful streamed requests (their P50/P99
are exact only over every value; see `TokenTally`) and one decision time
per slot (`timing_summary`'s P95). A grid run that needs the requests
themselves (the bench's bootstraps) asks for `RequestColumns`: compact
columns, not records.

What it does not do: it keeps no history for figures or inspection; a
caller that needs the records asks the loop to keep them (`keep_history`).
"""

from __future__ import annotations

import math
import statistics
from array import array
from collections.abc import Sequence
from typing import Any, get_args

from lmedge.api import ActuationResult, ClusterContext, Decision, RequestRecord
from lmedge.api.records import RequestOutcome
from lmedge.controller.loop import RunResult, SlotTiming
from lmedge.metrics import (
    AuditTally,
    ConflictTally,
    ReconfigurationTally,
    SegmentTally,
    StrandedTally,
)
from lmedge.sim.servicemodel import LowerBoundTally

#: Values a `QuantileTally` keeps exactly: 1,000,000 (8 MB) per LM and metric.
#: Beyond it every other value is dropped and only every 2^k-th new one kept
#: (a systematic sample), so P50/P99 become estimates; no shipped scenario
#: comes near it (token-level emulation is for small clusters).
EXACT_VALUES = 1_000_000


class QuantileTally:
    """Floats whose mean, P50 and P99 are wanted: exact up to `EXACT_VALUES` values."""

    def __init__(self, limit: int = EXACT_VALUES) -> None:
        self.values = array("d")
        self.count = 0
        self.total = 0.0  # running sum: the mean once values are sampled
        self._limit, self._stride = limit, 1

    def add(self, x: float) -> None:
        self.count += 1
        self.total += x
        if self.count % self._stride == 0:
            self.values.append(x)
            if len(self.values) >= self._limit:
                self.values = self.values[::2]
                self._stride *= 2

    def mean(self) -> float | None:
        if not self.count:
            return None
        return statistics.fmean(self.values) if self._stride == 1 else self.total / self.count

    def quantile(self, q: float) -> float | None:
        """The value at rank ceil(q n) of the sorted values (as `summary._quantile`)."""
        if not self.values:
            return None
        s = sorted(self.values)
        return s[min(len(s) - 1, math.ceil(q * len(s)) - 1)]


class TokenTally:
    """Per serving LM, the token-level figures of `summary.token_summary`, as requests finish."""

    def __init__(self) -> None:
        self._per_lm: dict[str, dict[str, Any]] = {}

    def add(self, r: RequestRecord) -> None:
        if r.output_tokens is None:
            return
        row = self._per_lm.get(r.model or r.lm)
        if row is None:
            row = self._per_lm[r.model or r.lm] = {
                "requests": 0,
                "successes": 0,
                "input": 0,
                "output": 0,
                "ttft": QuantileTally(),
                "tpot": QuantileTally(),
            }
        row["requests"] += 1
        row["input"] += r.input_tokens or 0
        row["output"] += r.output_tokens or 0
        if r.outcome == "success" and r.ttft_s is not None:
            row["successes"] += 1
            row["ttft"].add(r.ttft_s)
            if r.tpot_s is not None:
                row["tpot"].add(r.tpot_s)

    def __bool__(self) -> bool:
        return bool(self._per_lm)

    def per_lm(self) -> list[dict[str, Any]]:
        out = []
        for lm, row in self._per_lm.items():
            n = row["requests"]
            out.append(
                {
                    "lm": lm,
                    "requests": n,
                    "successes": row["successes"],
                    # integer sums are exact, as `statistics.fmean` over the ints is
                    "input_tokens_mean": row["input"] / n,
                    "output_tokens_mean": row["output"] / n,
                    **_stats("ttft_s", row["ttft"]),
                    **_stats("tpot_s", row["tpot"]),
                }
            )
        return out


def _stats(name: str, xs: QuantileTally) -> dict[str, float | None]:
    return {
        f"{name}_mean": xs.mean(),
        f"{name}_p50": xs.quantile(0.5),
        f"{name}_p99": xs.quantile(0.99),
    }


class RequestColumns:
    """The measured requests of a run as typed columns, for `runner.RequestTable`.

    About 30 bytes a request (array slots, interned LM names) instead of a
    record's kilobyte; kept only by runs that send their requests back.
    """

    def __init__(self) -> None:
        self.names: dict[str, int] = {}  # LM or class -> code, first seen first
        self.slot = array("i")
        self.lm = array("i")
        self.serving = array("i")  # the code of `model or lm`
        self.prompts = array("i")
        self.success = array("b")
        self.latency_s = array("d")

    def add(self, r: RequestRecord) -> None:
        names = self.names
        self.slot.append(r.slot)
        self.lm.append(names.setdefault(r.lm, len(names)))
        self.serving.append(names.setdefault(r.model or r.lm, len(names)))
        self.prompts.append(r.prompts)
        self.success.append(r.outcome == "success")
        self.latency_s.append(round(r.latency_s, 6))


class RunTally:
    """Everything `summarize` reads, folded in as the loop reports it (`RunRecorder`).

    `ctx` is the run's slot-0 context (its LMs, deadlines, tau and lambda
    define the summary's metrics, as they always have); `slots` the measured
    slots: requests that arrived later (while the run settles), and their
    slots' actuations and decisions, are left out, except that stranding
    looks at every actuation (an LM started while settling still served).
    """

    def __init__(
        self,
        ctx: ClusterContext,
        slots: int,
        window_slots: int,
        *,
        columns: bool = False,
    ) -> None:
        self.ctx, self.slots, self.window_slots = ctx, slots, window_slots
        self.deadlines = {lm: ctx.deadline_s(lm) for lm in ctx.lm_names}
        tau, self.tau_s = ctx.loop.tau_s, ctx.loop.tau_s
        self.segment = SegmentTally(
            window_slots, end_slot=slots, tau_s=tau, lam=ctx.loop.lam, deadlines=self.deadlines
        )
        self.conflicts = ConflictTally(tau_s=tau, deadlines=self.deadlines)
        self.outcomes: dict[str, int] = dict.fromkeys(get_args(RequestOutcome), 0)
        self.reconfiguration = ReconfigurationTally(ctx.lm_names)
        self.audit = AuditTally()
        self.stranded = StrandedTally(self.deadlines, ctx.loop.slot_s)
        self.bounds = LowerBoundTally()
        self.tokens = TokenTally()
        self.success_latency = QuantileTally()  # LYREO's mean and P99 (`balance_summary`)
        self.energy_j = QuantileTally()  # emulated energy (`routing_summary`): sum and mean
        self.decide_s = array("d")  # one a slot: 8 bytes
        self.store_s = 0.0
        self.columns = RequestColumns() if columns else None

    # -- RunRecorder ------------------------------------------------------------

    def placed(self, slot: int, actuation: ActuationResult) -> None:
        self.stranded.placed(slot, actuation)
        if slot < self.slots:
            self.reconfiguration.add(actuation)

    def finished(self, slot: int, ctx: ClusterContext, records: Sequence[RequestRecord]) -> None:
        self.stranded.advance(slot)
        for r in records:
            if r.slot >= self.slots:
                continue
            self.segment.add(r)
            self.conflicts.add(r)
            self.outcomes[r.outcome] += 1
            self.stranded.finished(r, slot)
            self.bounds.add(ctx, r)
            self.tokens.add(r)
            if r.outcome == "success":
                self.success_latency.add(r.latency_s)
            if r.energy_j is not None:
                self.energy_j.add(r.energy_j)
            if self.columns is not None:
                self.columns.add(r)

    def decided(self, decisions: Sequence[Decision[Any]]) -> None:
        for d in decisions:
            if d.slot < self.slots:
                self.audit.add(d)

    def timed(self, timing: SlotTiming) -> None:
        self.decide_s.append(timing.decide_s)
        self.store_s += timing.store_s

    # -- replaying a kept history -------------------------------------------------

    @classmethod
    def replay(cls, result: RunResult, window_slots: int, *, columns: bool = False) -> RunTally:
        """The tally of a run that kept its history (`keep_history=True`).

        Every request is bounded in `result.context` (the history does not say
        which context was in force): an LM a timeline added has no bound here.
        """
        tally = cls(result.context, result.slots, window_slots, columns=columns)
        for a, slot in zip(result.actuations, result.placement_slots, strict=True):
            tally.placed(slot, a)
        tally.finished(max(result.placement_slots, default=0), result.context, result.records)
        tally.decided(result.decisions)
        for t in result.timings:
            tally.timed(t)
        return tally
