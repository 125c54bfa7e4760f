"""The paper's metrics (§III, §VI-B): success, fairness, latency, the objective,
inactive-target conflicts (Table II), reconfiguration rates (Table III) and the
agent audit counts.

Everything here is a pure function of records and decisions, so the emulator,
the controller on a real cluster and offline analysis of a store compute the
same numbers. It deliberately reads nothing from the store and knows nothing
about time: windows are counted in slots, from `RequestRecord.slot` (the slot
the request arrived in).

Definitions (paper Eq. 1-6, 10):

- delta_q = 1 when the request was served by an active LM at its destination
  within its deadline. The component that writes a `RequestRecord` decides
  this; here a record with ``outcome == "success"`` *is* a success.
- A request refused by admission control (``outcome == "rejected"``) is a
  failure, delta_q = 0, and stays in A_i: refusing a request can never raise
  a success ratio, Jain's index or the objective above what timing it out
  would give (it only spares the capacity it would have used). It reached
  no destination, so it is not an inactive-target conflict and is outside
  the conflict statistics.
- A_i requests of LM i, S_i successes, rho_i = S_i / A_i. "LM" is the
  record's `lm`: a request class when the workload generates classes several
  LMs serve (the serving LM is `model`, whose deadline applies), so fairness
  is across request classes (service types); `metric_lms` gives the per-LM
  list then (LMs with requests of their own, then the classes).
- Jain F = (sum rho)^2 / (I sum rho^2) over the I LM types with arrivals in the
  window; F_norm = (F - 1/I) / (1 - 1/I).
- T_norm = mean over successful q of T_q / tau_i(q).
- Mean latency is the request-weighted mean over successes; the LM-mean
  latency is the unweighted mean of the per-LM (success-only) mean latencies,
  the paper's headline figure (MILP: (8.0 + 12.6 + 7.2 + 877.7) / 4 = 226.4
  against its reported 226.6); see `lm_mean_latency`.
- J = lam * T_norm + (1 - lam) * (1 - F_norm), lam = 0.5; lower is better.

Degenerate cases are decided once, in `fairness` and `t_norm`, and documented
there; every window with at least one request has a defined objective.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence, Set
from itertools import pairwise
from typing import Any, Literal, NamedTuple, Protocol

from pydantic import Field

from lmedge.api.base import WireModel
from lmedge.api.constants import LAMBDA as LAMBDA  # re-exported: the CLI reads them here
from lmedge.api.constants import TAU_S as TAU_S
from lmedge.api.decisions import Decision, WindowAudit
from lmedge.api.interfaces import ActuationResult
from lmedge.api.observations import ClusterContext, EpochMetrics, LMStats
from lmedge.api.records import RequestRecord
from lmedge.api.totals import LoadBalanceStats as LoadBalanceStats
from lmedge.api.totals import WindowTotals


class MetricRecord(Protocol):
    """What the window metrics read of a request: a `RequestRecord` or its `MetricRow`."""

    @property
    def lm(self) -> str: ...
    @property
    def model(self) -> str | None: ...
    @property
    def origin(self) -> str: ...
    @property
    def destination(self) -> str: ...
    @property
    def outcome(self) -> str: ...
    @property
    def conflict(self) -> bool: ...
    @property
    def queue_s(self) -> float: ...
    @property
    def latency_s(self) -> float: ...


class MetricRow(NamedTuple):
    """The fields of a record that `window_metrics` reads, in a tenth of its memory.

    For code that must keep many requests (an epoch at 1,000 workers is
    ~500,000 records, over a GiB as full records; the control loop keeps a
    `WindowTally` instead). A named tuple: ten times cheaper to make than a
    frozen dataclass, and the collector stops walking a tuple of plain values.
    """

    lm: str
    model: str | None
    origin: str
    destination: str
    outcome: str
    conflict: bool
    queue_s: float
    latency_s: float

    @classmethod
    def of(cls, r: RequestRecord) -> MetricRow:
        return cls(
            r.lm, r.model, r.origin, r.destination, r.outcome, r.conflict, r.queue_s, r.latency_s
        )


def is_success(record: MetricRecord) -> bool:
    """delta_q: the record's producer already checked "LM active and T_q <= tau"."""
    return record.outcome == "success"


def is_rejected(record: MetricRecord) -> bool:
    """Refused at once by admission control (a failure that never reached a destination)."""
    return record.outcome == "rejected"


def share(part: int, whole: int) -> float | None:
    """part / whole, None when whole is 0 (e.g. the rejected ratio of a window without requests)."""
    return part / whole if whole else None


def jain(ratios: Sequence[float]) -> float | None:
    """Jain's index F = (sum x)^2 / (n sum x^2) in [1/n, 1].

    None for an empty sequence, and for an all-zero one where the formula is
    0/0 (`fairness` decides what that means for the objective).
    """
    n = len(ratios)
    squares = sum(x * x for x in ratios)
    if n == 0 or squares == 0:
        return None
    return min(1.0, sum(ratios) ** 2 / (n * squares))


def fairness(ratios: Sequence[float]) -> tuple[float | None, float | None]:
    """(F, F_norm) over the success ratios of the LM types that had arrivals.

    - no types: (None, None) — there is nothing to be fair about;
    - every ratio 0 (nothing served): F is 0/0. We report F = 1/I, the minimum
      of the index, and F_norm = 0, i.e. the worst fairness: a window in which
      no type is served must not look fair to the objective (equal starvation
      is not a fair service);
    - I = 1: F = 1 and F_norm is 0/0. One type cannot be treated unfairly
      relative to others, so F_norm = 1 (0 if it got nothing, as above);
    - all ratios equal and > 0: F = 1, F_norm = 1.
    """
    n = len(ratios)
    if n == 0:
        return None, None
    f = jain(ratios)
    if f is None:
        return 1.0 / n, 0.0
    if n == 1:
        return f, 1.0
    f_norm = (f - 1.0 / n) / (1.0 - 1.0 / n)
    return f, min(1.0, max(0.0, f_norm))


def t_norm(latencies: Sequence[float], deadlines: Sequence[float]) -> float:
    """T_norm: the mean of T_q / tau over successful requests.

    Defined as 1.0 when there is no success (the paper's formula is 0/0):
    a success never exceeds its deadline, so 1 is the worst value T_norm can
    take, and an objective that rewarded serving nobody with a *low* latency
    term would be perverse. Callers with no requests at all get None from
    `window_metrics` instead.
    """
    if len(latencies) != len(deadlines):
        raise ValueError("latencies and deadlines differ in length")
    return mean_t_norm(
        sum(t / d for t, d in zip(latencies, deadlines, strict=True)), len(latencies)
    )


def mean_t_norm(ratio_sum: float, successes: int) -> float:
    """T_norm from the sum of T_q / tau over `successes` successes (1.0 without one: `t_norm`)."""
    return ratio_sum / successes if successes else 1.0


def lm_mean_latency(per_lm: Sequence[LMStats], deadlines: Mapping[str, float]) -> float | None:
    """The unweighted mean over LM types of their success-only mean latencies.

    LMs without arrivals are left out (as from Jain's index). An LM with
    arrivals but no success has no mean latency; it counts at its deadline
    (`deadlines[lm]`): no success can be slower, so a policy that starves an
    LM is never rewarded with a lower LM-mean, and leaving the LM out would
    do exactly that. None when no LM had arrivals.
    """
    values = [
        s.mean_latency_s if s.mean_latency_s is not None else deadlines[s.lm]
        for s in per_lm
        if s.arrivals
    ]
    return sum(values) / len(values) if values else None


def penalized_latency(stats: LMStats, deadline: float) -> float | None:
    """An LM's mean latency over all its requests, a failed one counted at its deadline.

    (sum of the successes' latencies + (A_i - S_i) tau_i) / A_i: a request
    refused by admission control, timed out, lost or failed counts at tau_i,
    the latency no success can exceed, so a policy that refuses work cannot
    look faster than one that serves it (the success-only `mean_latency_s`
    can). None without arrivals.
    """
    if not stats.arrivals:
        return None
    served = stats.mean_latency_s * stats.successes if stats.mean_latency_s is not None else 0.0
    return (served + (stats.arrivals - stats.successes) * deadline) / stats.arrivals


def lm_mean_penalized_latency(
    per_lm: Sequence[LMStats], deadlines: Mapping[str, float]
) -> float | None:
    """The unweighted mean over LMs with arrivals of `penalized_latency` (`deadlines[lm]`)."""
    values = [penalized_latency(s, deadlines[s.lm]) for s in per_lm if s.arrivals]
    xs = [v for v in values if v is not None]
    return sum(xs) / len(xs) if xs else None


def objective(t_norm_value: float, f_norm_value: float, lam: float = LAMBDA) -> float:
    """J = lam T_norm + (1 - lam)(1 - F_norm); lower is better, in [0, 1]."""
    return lam * t_norm_value + (1.0 - lam) * (1.0 - f_norm_value)


def _deadline(lm: str, tau_s: float, deadlines: Mapping[str, float] | None) -> float:
    if deadlines and lm in deadlines:
        return deadlines[lm]
    return tau_s


def window_metrics(
    records: Iterable[MetricRecord],
    lms: Sequence[str],
    *,
    tau_s: float = TAU_S,
    lam: float = LAMBDA,
    deadlines: Mapping[str, float] | None = None,
    cross_node_only: bool = True,
) -> EpochMetrics:
    """The paper's metrics over one window of records.

    `lms` is the LM list of the cluster context: every listed LM appears in
    `per_lm` (with `success_ratio=None` when it had no arrivals); an LM found
    only in the records is appended after them, so no request is dropped.
    LMs without arrivals are left out of the Jain index: rho_i = S_i/A_i is
    undefined for them and counting them as 0 (or 1) would report an
    unfairness (or a fairness) no request experienced.

    `deadlines` maps an LM to its own deadline (LMService `deadlineS`); others
    use `tau_s`. With no request at all every aggregate is None.
    `conflict_ratio` follows `conflicts` (cross-node requests by default).
    Computed by a `WindowTally`, as a run's summary is while it goes.
    """
    tally = WindowTally(tau_s=tau_s, deadlines=deadlines, cross_node_only=cross_node_only)
    for r in records:
        tally.add(r)
    return tally.metrics(lms, lam)


class WindowTally:
    """The running counts and sums of one window: `window_metrics` without keeping records.

    `add` a record at a time, read `metrics` at any point; memory is a few
    numbers per LM. Sums are accumulated in record order, as `sum()` over the
    window's records would, so the result is the same to the last bit.
    """

    __slots__ = (
        "_deadline_of",
        "arrivals",
        "conflicts",
        "deadlines",
        "latency_sum",
        "ok",
        "ok_latency_sum",
        "ok_ratio_sum",
        "rejected",
        "requests",
        "successes",
        "tau_s",
    )

    def __init__(
        self,
        *,
        tau_s: float = TAU_S,
        deadlines: Mapping[str, float] | None = None,
        cross_node_only: bool = True,
    ) -> None:
        self.tau_s = tau_s
        self.deadlines = deadlines
        self.requests = self.ok = 0
        self.ok_latency_sum = self.ok_ratio_sum = 0.0  # sum of T_q; sum of T_q / tau_i
        self.arrivals: dict[str, int] = {}
        self.successes: dict[str, int] = {}
        self.rejected: dict[str, int] = {}
        self.latency_sum: dict[str, float] = {}
        self._deadline_of: dict[str, float] = {}
        self.conflicts = ConflictTally(
            tau_s=tau_s, deadlines=deadlines, cross_node_only=cross_node_only
        )

    def add(self, r: MetricRecord) -> None:
        """Count one finished request."""
        lm = r.lm
        self.requests += 1
        if lm not in self.arrivals:
            self.arrivals[lm] = self.successes[lm] = self.rejected[lm] = 0
            self.latency_sum[lm] = 0.0
        self.arrivals[lm] += 1
        self.rejected[lm] += is_rejected(r)
        if is_success(r):
            t = r.latency_s
            serving = r.model or lm
            d = self._deadline_of.get(serving)
            if d is None:
                d = self._deadline_of[serving] = _deadline(serving, self.tau_s, self.deadlines)
            self.successes[lm] += 1
            self.latency_sum[lm] += t
            self.ok += 1
            self.ok_latency_sum += t
            self.ok_ratio_sum += t / d
        self.conflicts.add(r)

    def use_deadlines(self, tau_s: float, deadlines: Mapping[str, float] | None) -> None:
        """Count the requests added from now on with these deadlines (a context changed)."""
        self.tau_s = self.conflicts.tau_s = tau_s
        self.deadlines = self.conflicts.deadlines = deadlines
        self._deadline_of.clear()

    @property
    def names(self) -> set[str]:
        """The LMs (or request classes) that had arrivals."""
        return set(self.arrivals)

    def per_lm(self, lms: Sequence[str]) -> list[LMStats]:
        """Per-LM counts: `lms` in order, then LMs seen only in the records, sorted."""
        order = list(dict.fromkeys([*lms, *sorted(set(self.arrivals) - set(lms))]))
        out = []
        for lm in order:
            a, s = self.arrivals.get(lm, 0), self.successes.get(lm, 0)
            out.append(
                LMStats(
                    lm=lm,
                    arrivals=a,
                    successes=s,
                    success_ratio=s / a if a else None,
                    mean_latency_s=self.latency_sum[lm] / s if s else None,
                    rejected=self.rejected.get(lm, 0),
                )
            )
        return out

    def metrics(self, lms: Sequence[str], lam: float = LAMBDA) -> EpochMetrics:
        """`window_metrics` of the records added so far."""
        per_lm = self.per_lm(lms)
        if not self.requests:
            return EpochMetrics(
                per_lm=per_lm,
                requests=0,
                successes=0,
                mean_latency_s=None,
                lm_mean_latency_s=None,
                jain=None,
                f_norm=None,
                t_norm=None,
                objective=None,
            )
        f, f_n = fairness([s.success_ratio for s in per_lm if s.success_ratio is not None])
        tn = mean_t_norm(self.ok_ratio_sum, self.ok)
        assert f_n is not None  # at least one LM had arrivals
        return EpochMetrics(
            per_lm=per_lm,
            requests=self.requests,
            successes=self.ok,
            rejected=sum(self.rejected.values()),
            mean_latency_s=self.ok_latency_sum / self.ok if self.ok else None,
            lm_mean_latency_s=lm_mean_latency(per_lm, self.lm_deadlines(per_lm)),
            jain=f,
            f_norm=f_n,
            t_norm=tn,
            objective=objective(tn, f_n, lam),
            conflict_ratio=self.conflicts.stats().ratio or 0.0,
        )

    def lm_deadlines(self, per_lm: Sequence[LMStats]) -> dict[str, float]:
        """The deadline each row of `per_lm` is penalized at (its own, else tau)."""
        return {s.lm: _deadline(s.lm, self.tau_s, self.deadlines) for s in per_lm}


class SegmentMetrics(WireModel):
    """A segment cut into fixed windows, plus the segment as one window.

    `overall` pools every record of the segment; the `window_mean_*` fields
    average the per-window values that are defined, which is how the paper
    reports "mean Jain's index" and "mean latency across the windows" (Fig. 6).
    """

    window_slots: int = Field(ge=1)
    start_slot: int = Field(ge=0)
    end_slot: int = Field(ge=0, description="First slot after the segment.")
    windows: list[EpochMetrics]
    overall: EpochMetrics
    window_mean_jain: float | None
    window_mean_latency_s: float | None
    window_mean_lm_mean_latency_s: float | None = None
    window_mean_objective: float | None


def _mean(values: Iterable[float | None]) -> float | None:
    xs = [v for v in values if v is not None]
    return sum(xs) / len(xs) if xs else None


def segment_metrics(
    records: Iterable[RequestRecord],
    lms: Sequence[str],
    window_slots: int,
    *,
    start_slot: int = 0,
    end_slot: int | None = None,
    tau_s: float = TAU_S,
    lam: float = LAMBDA,
    deadlines: Mapping[str, float] | None = None,
) -> SegmentMetrics:
    """Per-window metrics over [start_slot, end_slot) and the whole segment.

    Windows are [start + k w, start + (k+1) w); the last one may be shorter.
    Empty windows are kept (all aggregates None) so that window k always
    covers the same slots across policies. Records outside the segment are
    ignored. `end_slot` defaults to one past the last record's slot.
    """
    if window_slots < 1:
        raise ValueError("window_slots must be at least 1")
    recs = [r for r in records if r.slot >= start_slot]
    end = (
        end_slot
        if end_slot is not None
        else max((r.slot for r in recs), default=start_slot - 1) + 1
    )
    tally = SegmentTally(
        window_slots,
        start_slot=start_slot,
        end_slot=end,
        tau_s=tau_s,
        lam=lam,
        deadlines=deadlines,
    )
    for r in recs:
        tally.add(r)
    return tally.metrics(lms)


class SegmentTally:
    """`segment_metrics` as records arrive: one `WindowTally` per window and one overall.

    Records outside [start_slot, end_slot) are ignored; windows are made as
    records reach them (and padded to the segment's length when read), so
    memory is a few numbers per LM and window, never the records.
    """

    def __init__(
        self,
        window_slots: int,
        *,
        start_slot: int = 0,
        end_slot: int,
        tau_s: float = TAU_S,
        lam: float = LAMBDA,
        deadlines: Mapping[str, float] | None = None,
    ) -> None:
        if window_slots < 1:
            raise ValueError("window_slots must be at least 1")
        self.window_slots = window_slots
        self.start_slot = start_slot
        self.end_slot = max(end_slot, start_slot)
        self.lam = lam
        self._kw: dict[str, Any] = {"tau_s": tau_s, "deadlines": deadlines}
        self.windows: list[WindowTally] = []
        self.overall = WindowTally(**self._kw)

    def add(self, r: RequestRecord) -> None:
        """Count a finished request in its arrival slot's window (`RequestRecord.slot`)."""
        slot = r.slot
        if not self.start_slot <= slot < self.end_slot:
            return
        k = (slot - self.start_slot) // self.window_slots
        while len(self.windows) <= k:
            self.windows.append(WindowTally(**self._kw))
        self.windows[k].add(r)
        self.overall.add(r)

    def metrics(self, lms: Sequence[str]) -> SegmentMetrics:
        """The `SegmentMetrics` of what was added, every LM of `lms` in each window."""
        count = -(-(self.end_slot - self.start_slot) // self.window_slots)
        while len(self.windows) < count:
            self.windows.append(WindowTally(**self._kw))
        windows = [w.metrics(lms, self.lam) for w in self.windows]
        return SegmentMetrics(
            window_slots=self.window_slots,
            start_slot=self.start_slot,
            end_slot=self.end_slot,
            windows=windows,
            overall=self.overall.metrics(lms, self.lam),
            window_mean_jain=_mean(w.jain for w in windows),
            window_mean_latency_s=_mean(w.mean_latency_s for w in windows),
            window_mean_lm_mean_latency_s=_mean(w.lm_mean_latency_s for w in windows),
            window_mean_objective=_mean(w.objective for w in windows),
        )


def metric_lms(ctx: ClusterContext, records: Iterable[MetricRecord]) -> list[str]:
    """The per-LM list for metrics over `records`: `ctx.lm_names` unless classes arrived.

    When some records name a request class several LMs serve, the list is the
    LMs that had requests of their own or serve none of those classes, then
    the classes (context order): an LM that only served a class is not a
    service type of the workload, so it gets no empty row.
    """
    return lms_named(ctx, {r.lm for r in records})


def lms_named(ctx: ClusterContext, named: Set[str]) -> list[str]:
    """`metric_lms` from the set of LMs (or request classes) the records name."""
    classes = [c for c in ctx.request_classes if c in named and not ctx.has_service(c)]
    if not classes:
        return ctx.lm_names
    served = {m for c in classes for m in ctx.models_for(c)}
    return [lm for lm in ctx.lm_names if lm in named or lm not in served] + classes


def context_segment_metrics(
    records: Iterable[RequestRecord], ctx: ClusterContext, window_slots: int | None = None
) -> SegmentMetrics:
    """`segment_metrics` with the LM list (`metric_lms`), tau, lambda, deadlines, epoch of `ctx`."""
    recs = list(records)
    return segment_metrics(
        recs,
        metric_lms(ctx, recs),
        window_slots or ctx.loop.epoch_slots,
        tau_s=ctx.loop.tau_s,
        lam=ctx.loop.lam,
        deadlines={lm: ctx.deadline_s(lm) for lm in ctx.lm_names},
    )


class ConflictStats(WireModel):
    """Inactive-target conflicts (paper Table II).

    A conflict is a request that reached a destination where its LM was not
    active on arrival (`RequestRecord.conflict`). Like the paper, only
    cross-node requests (origin != destination) are considered unless
    `scope` is `all`. Rejected requests reached no destination and are in
    neither count. Queue delay is `queue_s`, except that a timed-out
    request counts its deadline tau, so unresolved conflicts carry their cost.
    """

    scope: Literal["cross-node", "all"]
    requests: int = Field(ge=0, description="Requests in scope.")
    conflicts: int = Field(ge=0)
    ratio: float | None = Field(description="conflicts / requests; None without requests.")
    conflict_queue_delay_s: float | None
    non_conflict_queue_delay_s: float | None
    conflict_timeout_ratio: float | None = Field(description="Timed out among conflicts.")


def conflict_stats(
    records: Iterable[MetricRecord],
    *,
    tau_s: float = TAU_S,
    deadlines: Mapping[str, float] | None = None,
    cross_node_only: bool = True,
) -> ConflictStats:
    """Table II over `records`; see `ConflictStats`."""
    tally = ConflictTally(tau_s=tau_s, deadlines=deadlines, cross_node_only=cross_node_only)
    for r in records:
        tally.add(r)
    return tally.stats()


class ConflictTally:
    """`conflict_stats` as records arrive: counts and delay sums, in record order."""

    __slots__ = (
        "c",
        "cross_node_only",
        "deadlines",
        "delay_c",
        "delay_n",
        "n",
        "tau_s",
        "timeouts",
    )

    def __init__(
        self,
        *,
        tau_s: float = TAU_S,
        deadlines: Mapping[str, float] | None = None,
        cross_node_only: bool = True,
    ) -> None:
        self.tau_s, self.deadlines, self.cross_node_only = tau_s, deadlines, cross_node_only
        self.n = self.c = self.timeouts = 0
        self.delay_c = self.delay_n = 0.0  # sums; their counts are c and n - c

    def add(self, r: MetricRecord) -> None:
        if is_rejected(r) or (self.cross_node_only and r.origin == r.destination):
            return
        self.n += 1
        ok = is_success(r)
        delay = r.queue_s if ok else _deadline(r.model or r.lm, self.tau_s, self.deadlines)
        if r.conflict:
            self.c += 1
            self.timeouts += not ok
            self.delay_c += delay
        else:
            self.delay_n += delay

    def stats(self) -> ConflictStats:
        c, n = self.c, self.n
        return ConflictStats(
            scope="cross-node" if self.cross_node_only else "all",
            requests=n,
            conflicts=c,
            ratio=c / n if n else None,
            conflict_queue_delay_s=self.delay_c / c if c else None,
            non_conflict_queue_delay_s=self.delay_n / (n - c) if n - c else None,
            conflict_timeout_ratio=self.timeouts / c if c else None,
        )


class LMReconfiguration(WireModel):
    """Actuated activations, deactivations and resizes of one LM (or `*` for all LMs)."""

    lm: str
    activations: int = Field(ge=0)
    deactivations: int = Field(ge=0)
    resizes: int = Field(default=0, ge=0)
    activations_per_100: float | None
    deactivations_per_100: float | None
    resizes_per_100: float | None = None


class ReconfigurationStats(WireModel):
    """Deployment reconfiguration frequency (paper Table III), from what was actuated.

    Events are what the backend did, as its `ActuationResult` reports them,
    not what the deployers decided: an activation is a pod started for an LM
    that had none on the node (`started`), a deactivation a pod removed
    (`stopped`), a resize a running pod replaced by one of another shape
    (`resized`: mode, cores or vGPUs; a gpu<->cpu switch is one). A decided
    change that was not carried out -- voided by the pending rule, refused
    as a misfit, a repeat of what already runs -- is no event; the first
    start of an LM on a cold node is one (a pod was started). Rates are per
    100 node-slot decisions (one `ActuationResult` per placement given; the
    paper divides by its 19,404 decisions). `transitions` counts the
    decisions that changed anything on the node, `set_changes` those that
    changed its active set (a start or a stop), and `set_change_ratio` =
    set_changes / decisions.
    """

    decisions: int = Field(ge=0)
    transitions: int = Field(ge=0)
    per_lm: list[LMReconfiguration]
    total: LMReconfiguration
    set_changes: int = Field(ge=0)
    set_change_ratio: float | None


def reconfiguration_stats(
    actuations: Iterable[ActuationResult], lms: Sequence[str] = ()
) -> ReconfigurationStats:
    """Table III from the actuation results of the measured placements.

    `lms` lists LMs to report even with no events; others appear as they
    are seen, in order of first event.
    """
    tally = ReconfigurationTally(lms)
    for a in actuations:
        tally.add(a)
    return tally.stats()


class ReconfigurationTally:
    """`reconfiguration_stats` as actuation results arrive: counts per LM."""

    def __init__(self, lms: Sequence[str] = ()) -> None:
        self.on: dict[str, int] = defaultdict(int)
        self.off: dict[str, int] = defaultdict(int)
        self.resized: dict[str, int] = defaultdict(int)
        self.seen: dict[str, None] = dict.fromkeys(lms)
        self.decisions = self.transitions = self.set_changes = 0

    def add(self, a: ActuationResult) -> None:
        self.decisions += 1
        self.transitions += bool(a.started or a.stopped or a.resized)
        self.set_changes += bool(a.started or a.stopped)
        for events, counts in (
            (a.started, self.on),
            (a.stopped, self.off),
            (a.resized, self.resized),
        ):
            for lm in events:
                self.seen.setdefault(lm, None)
                counts[lm] += 1

    def stats(self) -> ReconfigurationStats:
        decisions = self.decisions
        on, off, resized = self.on, self.off, self.resized

        def per100(n: int) -> float | None:
            return 100.0 * n / decisions if decisions else None

        def row(lm: str, a: int, d: int, r: int) -> LMReconfiguration:
            return LMReconfiguration(
                lm=lm,
                activations=a,
                deactivations=d,
                resizes=r,
                activations_per_100=per100(a),
                deactivations_per_100=per100(d),
                resizes_per_100=per100(r),
            )

        return ReconfigurationStats(
            decisions=decisions,
            transitions=self.transitions,
            per_lm=[row(lm, on[lm], off[lm], resized[lm]) for lm in self.seen],
            total=row("*", sum(on.values()), sum(off.values()), sum(resized.values())),
            set_changes=self.set_changes,
            set_change_ratio=self.set_changes / decisions if decisions else None,
        )


def stranded_requests(
    records: Iterable[RequestRecord],
    actuations: Sequence[ActuationResult],
    actuation_slots: Sequence[int],
    deadlines: Mapping[str, float],
    slot_s: float,
) -> list[RequestRecord]:
    """Requests that waited at a node where their LM never ran while they could be served.

    A stranded request failed without any prompt served and its serving LM
    had no instance (started, not yet stopped) at its destination in any
    slot from its arrival to its deadline: it only waited out tau. The
    instances are rebuilt from the actuation results (each node starts
    empty; `actuation_slots[k]` is the slot of `actuations[k]`, in
    non-decreasing order). Rejected requests were refused at once and are
    never stranded. `deadlines` maps a serving LM to its deadline in seconds.
    """
    tally = StrandedTally(deadlines, slot_s, keep=True)
    for a, slot in zip(actuations, actuation_slots, strict=True):
        tally.placed(slot, a)
    for r in records:
        tally.finished(r)
    tally.close()
    assert tally.found is not None
    return tally.found


class StrandedTally:
    """`stranded_requests` as the run goes, without its history.

    Each (node, LM)'s hosted slots are kept as runs of consecutive slots (a
    new run only when an instance starts again), and a timed-out request
    waits in `pending` until the slots of its horizon have been actuated, or
    the run ends. `count` is the number found; `found` the requests, when
    `keep`.
    """

    def __init__(self, deadlines: Mapping[str, float], slot_s: float, *, keep: bool = False):
        self.deadlines, self.slot_s = deadlines, slot_s
        self._alive: dict[str, set[str]] = defaultdict(set)
        self._hosted: dict[tuple[str, str], list[list[int]]] = {}
        self._last_slot = -1  # the last slot with an actuation
        self.pending: list[tuple[RequestRecord, str, int]] = []  # (request, serving LM, last slot)
        self.count = 0
        self.found: list[RequestRecord] | None = [] if keep else None

    def placed(self, slot: int, a: ActuationResult) -> None:
        """An actuation of `slot` (slots come in non-decreasing order)."""
        if slot < self._last_slot:
            raise ValueError(f"actuation of slot {slot} after one of slot {self._last_slot}")
        self._last_slot = slot
        node = self._alive[a.node]
        node.difference_update(a.stopped)
        node.update(a.started, a.resized)
        for lm in node:
            runs = self._hosted.setdefault((a.node, lm), [])
            if runs and runs[-1][1] >= slot - 1:
                runs[-1][1] = slot
            else:
                runs.append([slot, slot])

    def finished(self, r: RequestRecord, known: int | None = None) -> None:
        """A finished request; the actuations of slots up to `known` are in (None: all)."""
        if r.outcome != "timeout" or r.prompts_done > 0:
            return
        lm = r.model or r.lm
        last = r.slot + math.ceil(self.deadlines.get(lm, TAU_S) / self.slot_s)
        self._resolve(r, lm, last, known)

    def advance(self, known: int) -> None:
        """The actuations of slots up to `known` are in: decide the pending requests it can."""
        waiting, self.pending = self.pending, []
        for r, lm, last in waiting:
            self._resolve(r, lm, last, known)

    def close(self) -> None:
        """The run is over: a request still pending was never hosted for."""
        waiting, self.pending = self.pending, []
        for r, lm, last in waiting:
            self._resolve(r, lm, last, None)

    def _resolve(self, r: RequestRecord, lm: str, last: int, known: int | None) -> None:
        upto = last if known is None else min(last, known)
        for first_run, last_run in reversed(self._hosted.get((r.destination, lm), ())):
            if last_run < r.slot:
                break
            if first_run <= upto:
                return  # hosted in its horizon: not stranded
        if known is None or last <= known:
            self.count += 1
            if self.found is not None:
                self.found.append(r)
        else:
            self.pending.append((r, lm, last))


class AuditCounts(WireModel):
    """How the decisions of one agent (and source, or `*` for all) fared.

    `calls` counts decisions; `parsed`/`validated` those whose output parsed
    and passed validation; `accepted`/`replaced` the final outcome; `errors`
    those that recorded a failed call.
    """

    agent: str
    source: str
    calls: int = Field(ge=0)
    parsed: int = Field(ge=0)
    validated: int = Field(ge=0)
    accepted: int = Field(ge=0)
    replaced: int = Field(ge=0)
    errors: int = Field(ge=0)


def audit_counts(decisions: Iterable[Decision[Any]]) -> list[AuditCounts]:
    """Counts per (agent, source) and per agent over all sources (`source="*"`).

    Rows are sorted by agent (planner, scheduler, deployer) then source, the
    `*` row first within an agent. Agents with no decision are absent.
    """
    tally = AuditTally()
    for d in decisions:
        tally.add(d)
    return tally.counts()


class AuditTally:
    """`audit_counts` as decisions are made: six counters per (agent, source)."""

    KEYS = ("calls", "parsed", "validated", "accepted", "replaced", "errors")

    def __init__(self) -> None:
        self._counts: dict[tuple[str, str], dict[str, int]] = {}

    def add(self, d: Decision[Any]) -> None:
        flags = (
            1,
            d.parsed,
            d.validated,
            d.outcome == "accepted",
            d.outcome == "replaced",
            d.error is not None,
        )
        for key in ((d.agent, d.source), (d.agent, "*")):
            row = self._counts.setdefault(key, dict.fromkeys(self.KEYS, 0))
            for k, flag in zip(self.KEYS, flags, strict=True):
                row[k] += int(flag)

    def counts(self) -> list[AuditCounts]:
        counts = self._counts
        agent_rank = {"planner": 0, "scheduler": 1, "deployer": 2}
        order = sorted(counts, key=lambda k: (agent_rank.get(k[0], 3), k[0], k[1] != "*", k[1]))
        return [AuditCounts(agent=a, source=s, **counts[(a, s)]) for a, s in order]


# -- LYREO's load-balance metrics (seed lyreo.txt §III-D, §IV-A, §V) ---------------
#
# W_s(t): server s's normalized KV memory-time in slot t, the KV bytes it held
# integrated over the slot over its memory-time capacity M_s x slot (M_s: its
# GPU memory, or memory on a CPU-only node). Y_s = |W_s - mean W| is its
# deviation, and Z_s(t+1) = max(Z_s(t) + Y_s(t) - eps, 0) its virtual queue.
# The high-KV share is the share of server-time at or above `HIGH_KV` of its
# engine's KV pool in use, sampled at every slot boundary (a server with several
# engines counts its fullest).

#: KV-pool occupancy at or above which a server counts as high-KV.
HIGH_KV = 0.9
#: Tolerated deviation epsilon of the evaluation's virtual queues (LYREO's setting).
BALANCE_EPSILON = 0.01


def load_deviations(loads: Mapping[str, float]) -> dict[str, float]:
    """Y_s = |W_s - mean_s W| per server (empty for no server)."""
    mean = math.fsum(loads.values()) / max(len(loads), 1)
    return {s: abs(w - mean) for s, w in loads.items()}


def next_virtual_queues(
    z: Mapping[str, float], deviations: Mapping[str, float], epsilon: float
) -> dict[str, float]:
    """Z_s(t+1) = max(Z_s(t) + Y_s(t) - epsilon, 0); a server new to `z` starts at 0."""
    return {s: max(z.get(s, 0.0) + y - epsilon, 0.0) for s, y in deviations.items()}


def load_balance_stats(
    samples: Sequence[Mapping[str, tuple[float, float]]],
    capacity_bytes: Mapping[str, float],
    slot_s: float,
    epsilon: float,
) -> LoadBalanceStats:
    """Y, Z and the high-KV share from readings at consecutive slot boundaries.

    `samples[t][s]` = (KV byte-seconds server s held up to the start of slot
    t, the share of its KV pool in use then); slot t's W_s is the growth to
    `samples[t + 1]` over `capacity_bytes[s] * slot_s`. Servers are those in
    `capacity_bytes` (one absent from a reading has held nothing yet); Z starts
    at 0 and is averaged after each slot's update.
    """
    servers = list(capacity_bytes)
    if not servers or len(samples) < 2:
        return LoadBalanceStats(
            slots=0, mean_deviation=None, mean_virtual_queue=None, high_kv_share=None
        )
    z: dict[str, float] = dict.fromkeys(servers, 0.0)
    ys: list[float] = []
    zs: list[float] = []
    high = 0
    for before, after in pairwise(samples):
        loads = {
            s: (after.get(s, (0.0, 0.0))[0] - before.get(s, (0.0, 0.0))[0])
            / (capacity_bytes[s] * slot_s)
            for s in servers
        }
        dev = load_deviations(loads)
        z = next_virtual_queues(z, dev, epsilon)
        ys.append(math.fsum(dev.values()) / len(servers))
        zs.append(math.fsum(z.values()) / len(servers))
        high += sum(1 for s in servers if before.get(s, (0.0, 0.0))[1] >= HIGH_KV)
    n = len(ys)
    return LoadBalanceStats(
        slots=n,
        mean_deviation=math.fsum(ys) / n,
        mean_virtual_queue=math.fsum(zs) / n,
        high_kv_share=high / (n * len(servers)),
    )


def window_totals(audits: Iterable[WindowAudit]) -> WindowTotals | None:
    """The `WindowTotals` of a run's audited routing windows (a cluster's gateways);
    None without a window.

    Decision time is the audit's `wait_s` (close to decision); a fallback is a
    window not routed by the router. The terms are over the windows that
    report J (a window routed by the seed or the map reports none).
    """
    windows = requests = fallbacks = 0
    wait = 0.0
    reported: list[WindowAudit] = []
    for a in audits:
        windows += 1
        requests += a.requests
        fallbacks += a.used != "router"
        wait += a.wait_s
        if a.j is not None:
            reported.append(a)
    if not windows:
        return None

    def mean(key: str) -> float | None:
        xs = [v for a in reported if (v := getattr(a, key)) is not None]
        return math.fsum(xs) / len(xs) if xs else None

    def total(key: str) -> float | None:
        xs = [v for a in reported if (v := getattr(a, key)) is not None]
        return math.fsum(xs) if xs else None

    return WindowTotals(
        windows=windows,
        requests=requests,
        fallbacks=fallbacks,
        decision_s_mean=wait / windows,
        reported=len(reported),
        j_mean=mean("j"),
        seed_j_mean=mean("seed_j"),
        quality_loss_mean=mean("quality_loss"),
        cost=total("cost"),
        energy_j=total("energy"),
        makespan_s_mean=mean("makespan"),
    )
