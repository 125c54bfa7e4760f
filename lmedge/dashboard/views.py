"""What each dashboard page shows, read from the store and computed with `lmedge.metrics`.

Every number here is a function of stored documents only, computed by the
same functions the emulator's summaries and `lmedge status` use, so the
dashboard never disagrees with them. Nothing here knows HTTP or HTML: the
functions take a `Store` and return plain data for the templates
(`lmedge.dashboard.app`), which makes them testable without a browser.

Reading and computing are separate steps: `read_run`/`read_cluster` take a
snapshot of the stored documents (the app holds its store lock only for
that), and `run_state`/`cluster_state` compute on the snapshot, so a long
computation never keeps other pages waiting. Every query parameter that
sizes a computation is bounded by what the run recorded (`check_slots`).

Not here: writing. The dashboard opens its store read-only.
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, Literal, cast
from urllib.parse import urlencode

from lmedge.api.constants import LoopConstants
from lmedge.api.decisions import MacroPolicy, Placement, WindowAudit
from lmedge.api.records import NodeTelemetry, RequestRecord
from lmedge.api.totals import LoadBalanceStats, RunTotals, WindowTotals
from lmedge.bench.summary import token_summary
from lmedge.bench.tally import QuantileTally
from lmedge.metrics import (
    conflict_stats,
    fairness,
    lm_mean_penalized_latency,
    penalized_latency,
    segment_metrics,
    window_totals,
)
from lmedge.store import AnyDecision, RunInfo, Store

#: Decisions read for one run's cluster view: enough for a 1000-slot run of
#: eight nodes; beyond it the page says how many it shows.
MAX_DEPLOYMENTS: Final = 20_000
#: Most decisions one timeline page lists.
MAX_DECISIONS: Final = 500
#: A cluster run's routing windows read for its run page (the newest): a
#: gateway audits one a second, so a few hours of one gateway; beyond it the
#: page says how many it shows.
MAX_WINDOWS: Final = 20_000


class NotFound(LookupError):
    """A run, a decision or a report that the store (or the report folders) lacks."""


class BadQuery(ValueError):
    """A query parameter outside what the run recorded; the message states the bound."""


def constants(info: RunInfo) -> LoopConstants:
    """The loop constants `info` was run with; the paper's defaults for a run stored without."""
    config = getattr(info, "config", None)  # runs recorded before runs carried their config
    return LoopConstants() if config is None else config.loop


def find_run(store: Store, run_id: str) -> RunInfo:
    """The registered run `run_id`; `NotFound` (naming a few known runs) otherwise."""
    runs = store.runs(limit=0)
    for r in runs:
        if r.id == run_id:
            return r
    shown = ", ".join(r.id for r in runs[:3]) + (", ..." if len(runs) > 3 else "")
    raise NotFound(f"no run {run_id!r} in this store (runs: {shown})")


@dataclass(frozen=True)
class RunRow:
    """One line of the runs list."""

    info: RunInfo
    requests: int
    success_ratio: float | None
    jain: float | None
    latest_decision: datetime | None
    live: bool


def latest_decision_time(store: Store, run_id: str) -> datetime | None:
    """When the run's newest decision was made (any agent); None without one."""
    found = store.decisions(run=run_id, limit=1)
    if not found:
        return None
    created = found[0].created_at
    return created if created.tzinfo else created.replace(tzinfo=UTC)


def is_live(latest: datetime | None, live_window_s: float, now: datetime | None = None) -> bool:
    """A run is live while its newest decision is younger than `live_window_s`."""
    if latest is None:
        return False
    now = now or datetime.now(UTC)
    return (now - latest).total_seconds() <= live_window_s


def run_rows(store: Store, live_window_s: float, limit: int = 50) -> list[RunRow]:
    """The latest `limit` runs with their request count, success ratio and Jain index."""
    rows = []
    for info in store.runs(limit=limit):
        stats = store.lm_stats(info.id) if _has_requests(store, info.id) else []
        requests = sum(s.arrivals for s in stats)
        successes = sum(s.successes for s in stats)
        jain, _ = fairness([s.success_ratio for s in stats if s.success_ratio is not None])
        latest = latest_decision_time(store, info.id)
        rows.append(
            RunRow(
                info=info,
                requests=requests,
                success_ratio=successes / requests if requests else None,
                jain=jain,
                latest_decision=latest,
                live=is_live(latest, live_window_s),
            )
        )
    return rows


def _has_requests(store: Store, run_id: str) -> bool:
    # lm_stats raises for a run without requests (its unknown-run check); a
    # registered run that has not served a request yet is simply empty.
    return next(iter(store.requests(run_id)), None) is not None


@dataclass(frozen=True)
class RunData:
    """A snapshot of what one run's page reads from the store."""

    info: RunInfo
    records: list[RequestRecord]
    latest_decision: datetime | None
    #: Slots the run recorded: one past its newest request's or decision's slot
    #: (0 when it recorded neither). Query parameters are bounded by it.
    slots: int
    #: What an emulated run stored at its end (`lmedge.api.totals`); None otherwise.
    totals: RunTotals | None = None
    #: A cluster run's audited routing windows, newest first, with their slots
    #: (at most `MAX_WINDOWS`).
    windows: list[tuple[int, WindowAudit]] = field(default_factory=list)


def read_run(store: Store, run_id: str) -> RunData:
    """The run's info, requests, newest decision, stored totals and routing windows
    (`NotFound` for an unknown run)."""
    info = find_run(store, run_id)
    records = list(store.requests(run_id))
    newest = store.decisions(run=run_id, limit=1)
    latest = latest_decision_time(store, run_id) if newest else None
    last = max([r.slot for r in records] + [d.slot for d in newest], default=-1)
    audited = (
        store.decisions(agent="scheduler", run=run_id, windows=True, limit=MAX_WINDOWS)
        if newest
        else []
    )
    return RunData(
        info=info,
        records=records,
        latest_decision=latest,
        slots=last + 1,
        totals=store.totals(run_id),
        windows=[(d.slot, d.window) for d in audited if d.window is not None],
    )


def check_slots(run_id: str, slots: int, **given: int | None) -> None:
    """Refuse (`BadQuery`) a slot parameter past what the run recorded.

    A slot parameter names a slot in [0, `slots`]: `slots` itself is the end
    of the run (an `end`, or a `start` that selects nothing). Without this
    bound one URL (`?window=1&end=1000000`) sized the computation, not the data.
    """
    for name, value in given.items():
        if value is not None and value > slots:
            raise BadQuery(
                f"{name} ({value}) is past the run: run {run_id!r} recorded {slots} slots, "
                f"so {name} is at most {slots}"
            )


@dataclass(frozen=True)
class RunState:
    """One run's metrics, overall and per window (the paper's Fig. 6/7/9 views)."""

    info: RunInfo
    constants: LoopConstants
    window_slots: int
    start_slot: int
    end_slot: int
    records: int
    headline: dict[str, float | int | None]
    per_lm: list[dict[str, Any]]
    lms: list[str]
    #: Per window: start slot, then the metrics of that window.
    windows: list[dict[str, Any]]
    #: Per LM: success ratio per window (None: no arrival in that window).
    lm_success: dict[str, list[float | None]]
    lm_latency: dict[str, list[float | None]]
    live: bool
    latest_decision: datetime | None
    #: Token-level figures of the counted requests (`TokenFigures`); None when
    #: none streamed tokens (a pipeline-engine run).
    tokens: TokenFigures | None = None
    #: LYREO's balance metrics, from the run's stored totals (its measured
    #: slots); None when it stored none (a cluster run, or no token engine).
    balance: LoadBalanceStats | None = None
    #: The request-level routing windows (`RoutingWindows`); None without any.
    routing: RoutingWindows | None = None


@dataclass(frozen=True)
class TokenFigures:
    """TTFT and TPOT (mean, P99) of the successful streamed requests counted, and
    per serving LM the rows of the summary's `tokens.per_lm` (`token_summary`)."""

    requests: int
    ttft_s_mean: float | None
    ttft_s_p99: float | None
    tpot_s_mean: float | None
    tpot_s_p99: float | None
    per_lm: list[dict[str, Any]]


def token_figures(records: list[RequestRecord]) -> TokenFigures | None:
    """The token-level figures of `records`; None when none has output tokens."""
    per_lm = token_summary(records, {})["per_lm"]
    if not per_lm:
        return None
    ttft, tpot = QuantileTally(), QuantileTally()
    for r in records:  # as `TokenTally`: a success with a first token counts
        if r.output_tokens is not None and r.outcome == "success" and r.ttft_s is not None:
            ttft.add(r.ttft_s)
            if r.tpot_s is not None:
                tpot.add(r.tpot_s)
    return TokenFigures(
        requests=sum(row["requests"] for row in per_lm),
        ttft_s_mean=ttft.mean(),
        ttft_s_p99=ttft.quantile(0.99),
        tpot_s_mean=tpot.mean(),
        tpot_s_p99=tpot.quantile(0.99),
        per_lm=per_lm,
    )


@dataclass(frozen=True)
class RoutingWindows:
    """A run's request-level routing windows: their totals, and where they come from.

    `source` is `stored` (an emulated run's `RunTotals`: every window of the
    run, its settling slots included, whatever the page's slot range) or
    `audited` (a cluster's window decisions in the page's slot range, folded
    by `metrics.window_totals`; `capped` when `MAX_WINDOWS` were read). Per
    slot, `per_slot` holds (slot, mean J, mean seed J) of the audited windows
    that report J (empty for a stored total).
    """

    totals: WindowTotals
    source: Literal["stored", "audited"]
    capped: bool = False
    per_slot: list[tuple[int, float, float | None]] = field(default_factory=list)


def routing_windows(data: RunData, start_slot: int, end_slot: int | None) -> RoutingWindows | None:
    """The run's routing windows in [start_slot, end_slot) (see `RoutingWindows`)."""
    audited = [
        (slot, a)
        for slot, a in data.windows
        if slot >= start_slot and (end_slot is None or slot < end_slot)
    ]
    folded = window_totals(a for _, a in audited)
    if folded is not None:
        by_slot: dict[int, list[WindowAudit]] = {}
        for slot, a in audited:
            if a.j is not None:
                by_slot.setdefault(slot, []).append(a)
        per_slot = []
        for slot in sorted(by_slot):
            group = by_slot[slot]
            seeds = [a.seed_j for a in group if a.seed_j is not None]
            per_slot.append(
                (
                    slot,
                    sum(a.j for a in group if a.j is not None) / len(group),
                    sum(seeds) / len(seeds) if seeds else None,
                )
            )
        capped = len(data.windows) >= MAX_WINDOWS
        return RoutingWindows(folded, "audited", capped=capped, per_slot=per_slot)
    if data.totals is not None and data.totals.windows is not None:
        return RoutingWindows(data.totals.windows, "stored")
    return None


def run_state(
    data: RunData,
    window_slots: int,
    live_window_s: float,
    start_slot: int = 0,
    end_slot: int | None = None,
) -> RunState:
    """The metrics of the run over its requests that arrived in [start_slot, end_slot).

    `end_slot` None: every stored request, including those an emulated run
    received while it settled after its measured slots (give the measured
    slot count to match `lmedge simulate`'s summary). Cut into `window_slots`
    windows. `BadQuery` when `start_slot` or `end_slot` is past the run.
    """
    info = data.info
    check_slots(info.id, data.slots, start=start_slot, end=end_slot)
    c = constants(info)
    records = [
        r for r in data.records if r.slot >= start_slot and (end_slot is None or r.slot < end_slot)
    ]
    lms = sorted({r.lm for r in records})
    seg = segment_metrics(
        records,
        lms,
        window_slots,
        start_slot=start_slot,
        end_slot=end_slot,
        tau_s=c.tau_s,
        lam=c.lam,
    )
    o = seg.overall
    deadlines = {s.lm: c.tau_s for s in o.per_lm}  # the store keeps tau, not each LM's deadline
    conflicts = conflict_stats(records, tau_s=c.tau_s)
    headline: dict[str, float | int | None] = {
        "objective": o.objective,
        "jain": o.jain,
        "lm_mean_latency_s": o.lm_mean_latency_s,
        "lm_mean_penalized_latency_s": lm_mean_penalized_latency(o.per_lm, deadlines),
        "mean_latency_s": o.mean_latency_s,
        "p99_latency_s": _latency_p99(records),
        "success_ratio": o.successes / o.requests if o.requests else None,
        "requests": o.requests,
        "successes": o.successes,
        "rejected": o.rejected,
        "rejected_ratio": o.rejected / o.requests if o.requests else None,
        "conflict_ratio": conflicts.ratio,
        "window_mean_jain": seg.window_mean_jain,
        "window_mean_objective": seg.window_mean_objective,
        **_energy(records),
    }
    windows = [
        {
            "start_slot": seg.start_slot + i * window_slots,
            "requests": w.requests,
            "objective": w.objective,
            "jain": w.jain,
            "mean_latency_s": w.mean_latency_s,
            "lm_mean_latency_s": w.lm_mean_latency_s,
            "lm_mean_penalized_latency_s": lm_mean_penalized_latency(w.per_lm, deadlines),
            "success_ratio": w.successes / w.requests if w.requests else None,
            "rejected_ratio": w.rejected / w.requests if w.requests else None,
            "conflict_ratio": w.conflict_ratio,
        }
        for i, w in enumerate(seg.windows)
    ]
    lm_success: dict[str, list[float | None]] = {lm: [] for lm in lms}
    lm_latency: dict[str, list[float | None]] = {lm: [] for lm in lms}
    for w in seg.windows:
        by_lm = {s.lm: s for s in w.per_lm}
        for lm in lms:
            lm_success[lm].append(by_lm[lm].success_ratio if lm in by_lm else None)
            lm_latency[lm].append(by_lm[lm].mean_latency_s if lm in by_lm else None)
    latest = data.latest_decision
    return RunState(
        info=info,
        constants=c,
        window_slots=window_slots,
        start_slot=seg.start_slot,
        end_slot=seg.end_slot,
        records=len(records),
        headline=headline,
        per_lm=[
            {
                **s.model_dump(),
                "rejected_ratio": s.rejected / s.arrivals if s.arrivals else None,
                "penalized_latency_s": penalized_latency(s, deadlines[s.lm]),
            }
            for s in o.per_lm
        ],
        lms=lms,
        windows=windows,
        lm_success=lm_success,
        lm_latency=lm_latency,
        live=is_live(latest, live_window_s),
        latest_decision=latest,
        tokens=token_figures(records),
        balance=data.totals.balance if data.totals is not None else None,
        routing=routing_windows(data, start_slot, end_slot),
    )


def _latency_p99(records: list[RequestRecord]) -> float | None:
    """P99 end-to-end latency of the successful requests (as the summary's `balance`)."""
    latencies = QuantileTally()
    for r in records:
        if r.outcome == "success":
            latencies.add(r.latency_s)
    return latencies.quantile(0.99)


def _energy(records: list[RequestRecord]) -> dict[str, float | None]:
    """Total and per-request energy of the requests that record one (the emulator's)."""
    joules = [r.energy_j for r in records if r.energy_j is not None]
    return {
        "energy_j": sum(joules) if joules else None,
        "energy_j_per_request": sum(joules) / len(joules) if joules else None,
    }


@dataclass(frozen=True)
class ClusterState:
    """Per node: what runs there (latest placement), over slots, and its queue backlog."""

    info: RunInfo
    nodes: list[str]
    #: Latest placement per node: (slot, [(lm, mode, cores, vgpus)]).
    placements: dict[str, tuple[int, list[tuple[str, str, float, int]]]]
    #: (node, slot) -> active LMs, for the timeline.
    active: dict[tuple[str, int], list[str]]
    slots: list[int]
    #: (node, slot) -> largest queue backlog seen in that slot, prompts.
    backlog: dict[tuple[str, int], float]
    backlog_slots: list[int]
    #: (node, slot) -> fullest token-engine KV cache seen in that slot, 0..1;
    #: empty when no node runs a token engine (llama.cpp, vLLM).
    kv_usage: dict[tuple[str, int], float]
    kv_slots: list[int]
    #: The macro policy shown: its epoch and (lm, node) -> routing weight, and roles.
    policy_epoch: int | None
    policy_epochs: list[int]
    policy_weights: dict[tuple[str, str], float]
    policy_roles: set[tuple[str, str]]
    policy_lms: list[str]
    policy_nodes: list[str]
    policy_rationale: str
    deployments_read: int
    deployments_capped: bool


@dataclass(frozen=True)
class ClusterData:
    """A snapshot of what one run's cluster page reads from the store."""

    info: RunInfo
    deployments: list[AnyDecision]
    policies: list[AnyDecision]
    telemetry: list[NodeTelemetry]
    latest_decision: datetime | None


def read_cluster(store: Store, run_id: str) -> ClusterData:
    """The run's placements, macro policies and telemetry (`NotFound` for an unknown run)."""
    return ClusterData(
        info=find_run(store, run_id),
        deployments=store.decisions(agent="deployer", run=run_id, limit=MAX_DEPLOYMENTS),
        policies=store.decisions(agent="planner", run=run_id, limit=MAX_DEPLOYMENTS),
        telemetry=store.telemetry(run=run_id, limit=0),
        latest_decision=latest_decision_time(store, run_id),
    )


def cluster_state(data: ClusterData, epoch: int | None) -> ClusterState:
    """The cluster view of the run; the macro policy of `epoch` (default: the latest)."""
    info, run_id = data.info, data.info.id
    c = constants(info)
    deployments = data.deployments
    placements: dict[str, tuple[int, list[tuple[str, str, float, int]]]] = {}
    active: dict[tuple[str, int], list[str]] = {}
    # Oldest first, so a later decision for the same (node, slot) wins.
    for d in reversed(deployments):
        value = cast(Placement, d.value)
        lms = [(p.lm, str(p.mode), p.cpu_cores, p.vgpus) for p in value.lms if p.mode != "off"]
        active[(value.node, d.slot)] = [f"{lm}:{mode}" for lm, mode, _, _ in lms]
        if value.node not in placements or d.slot >= placements[value.node][0]:
            placements[value.node] = (d.slot, lms)
    telemetry = data.telemetry
    backlog: dict[tuple[str, int], float] = {}
    kv: dict[tuple[str, int], float] = {}
    for t in telemetry:
        key = (t.node, int(t.time_s // c.slot_s))
        if "backlog_prompts" in t.extra:
            backlog[key] = max(backlog.get(key, 0.0), t.extra["backlog_prompts"])
        fullest = t.kv_usage_max
        if fullest is not None:
            kv[key] = max(kv.get(key, 0.0), fullest)
    nodes = sorted({n for n, _ in active} | {n for n, _ in backlog} | {n for n, _ in kv})
    policies = data.policies
    epochs = sorted({d.epoch for d in policies})
    chosen: AnyDecision | None = None
    if epoch is not None:
        chosen = next((d for d in policies if d.epoch == epoch), None)
        if chosen is None:
            shown = ", ".join(map(str, epochs)) or "none"
            raise NotFound(
                f"run {run_id!r} has no macro policy for epoch {epoch} (epochs: {shown})"
            )
    elif policies:
        chosen = policies[0]
    weights: dict[tuple[str, str], float] = {}
    roles: set[tuple[str, str]] = set()
    rationale = ""
    if chosen is not None:
        mp = cast(MacroPolicy, chosen.value)
        for r in mp.routing:
            for w in r.weights:
                weights[(r.lm, w.node)] = w.p
        for role in mp.roles:
            roles.update((lm, role.node) for lm in role.lms)
        rationale = mp.rationale
    return ClusterState(
        info=info,
        nodes=nodes,
        placements=placements,
        active=active,
        slots=sorted({s for _, s in active}),
        backlog=backlog,
        backlog_slots=sorted({s for _, s in backlog}),
        kv_usage=kv,
        kv_slots=sorted({s for _, s in kv}),
        policy_epoch=chosen.epoch if chosen is not None else None,
        policy_epochs=epochs,
        policy_weights=weights,
        policy_roles=roles,
        policy_lms=sorted({lm for lm, _ in weights} | {lm for lm, _ in roles}),
        policy_nodes=sorted({n for _, n in weights} | {n for _, n in roles}),
        policy_rationale=rationale,
        deployments_read=len(deployments),
        deployments_capped=len(deployments) >= MAX_DEPLOYMENTS,
    )


@dataclass(frozen=True)
class DecisionFilter:
    """The timeline's filters; None means any."""

    agent: str | None = None
    node: str | None = None
    epoch: int | None = None
    slot: int | None = None
    source: str | None = None
    outcome: str | None = None
    #: Only decisions with at least one violation (or an error).
    flagged: bool = False
    limit: int = 200
    #: `window`: only a gateway's routing windows; `slot`: none of them.
    kind: str | None = None

    def query(self) -> dict[str, str]:
        """The filters as URL query parameters (the ones that are set)."""
        items: dict[str, Any] = {
            "agent": self.agent,
            "node": self.node,
            "epoch": self.epoch,
            "slot": self.slot,
            "source": self.source,
            "outcome": self.outcome,
            "flagged": "true" if self.flagged else None,
            "kind": self.kind,
        }
        return {k: str(v) for k, v in items.items() if v is not None}


def check_decision_filter(run_id: str, newest: AnyDecision | None, f: DecisionFilter) -> None:
    """Refuse (`BadQuery`) a `slot` or `epoch` filter past the run's newest decision."""
    for name, value in (("slot", f.slot), ("epoch", f.epoch)):
        if value is None:
            continue
        if newest is None:
            raise BadQuery(f"{name} ({value}): run {run_id!r} has no decisions yet")
        bound = newest.slot if name == "slot" else newest.epoch
        if value > bound:
            raise BadQuery(
                f"{name} ({value}) is past the run: run {run_id!r}'s newest decision is at "
                f"{name} {bound}, so {name} is at most {bound}"
            )


def decisions(store: Store, run_id: str, f: DecisionFilter) -> list[AnyDecision]:
    """The run's latest decisions matching `f`, newest first."""
    find_run(store, run_id)
    # `flagged` is not an equality filter: read more, keep the flagged ones.
    limit = MAX_DECISIONS * 20 if f.flagged else f.limit
    found = store.decisions(
        agent=cast(Any, f.agent),
        run=run_id,
        epoch=f.epoch,
        slot=f.slot,
        node=f.node,
        source=f.source,
        outcome=f.outcome,
        windows=None if f.kind is None else f.kind == "window",
        limit=limit,
    )
    if f.flagged:
        found = [d for d in found if d.violations or d.error]
    return found[: f.limit]


#: The timeline's lanes: the three agents, and the scheduler's routing windows
#: (a gateway's, stored beside its slot maps) on a lane of their own.
LANES: Final = ("planner", "scheduler", "routing window", "deployer")


def lane(d: AnyDecision) -> str:
    """`routing window` for a gateway's routing window, else the decision's agent."""
    return "routing window" if d.window is not None else d.agent


def decision(
    store: Store,
    run_id: str,
    agent: str,
    slot: int,
    node: str | None,
    window_start: float | None = None,
) -> AnyDecision:
    """The decision `agent` made at `slot` (for `node`); the latest one if it decided twice.

    With `window_start`, the gateway `node`'s routing window that opened then
    (run clock, seconds); without, a scheduler's slot map, never a window.
    """
    find_run(store, run_id)
    if window_start is None:
        windows = False if agent == "scheduler" else None
        found = store.decisions(
            agent=cast(Any, agent), run=run_id, slot=slot, node=node, windows=windows, limit=1
        )
    else:
        candidates = store.decisions(
            agent=cast(Any, agent),
            run=run_id,
            slot=slot,
            node=node,
            windows=True,
            limit=MAX_WINDOWS,
        )
        found = [d for d in candidates if d.window is not None and d.window.start_s == window_start]
    if not found:
        where = f" for node {node!r}" if node else ""
        what = f"routing window opened at {window_start!r} s" if window_start is not None else ""
        raise NotFound(
            f"run {run_id!r} has no {agent} decision{' (' + what + ')' if what else ''} "
            f"at slot {slot}{where}"
        )
    return found[0]


def decision_key(d: AnyDecision) -> str:
    """The path of a decision's page, below its run (a routing window's names its start)."""
    path = f"decisions/{d.agent}/{d.slot}"
    query = {"node": d.node} if d.node else {}
    if d.window is not None:
        query["window_start"] = repr(d.window.start_s)
    return path + (f"?{urlencode(query)}" if query else "")


def telemetry_seen(store: Store, d: AnyDecision, slot_s: float) -> list[NodeTelemetry]:
    """The newest snapshot per node at or before the decision's run time: what it was shown.

    A deployer sees its own node; the planner and the scheduler see every node.
    """
    found = store.telemetry(run=d.run, node=d.node if d.agent == "deployer" else None, limit=0)
    latest: dict[str, NodeTelemetry] = {}
    for t in found:  # newest first
        if t.time_s <= d.sim_time_s + 1e-9 and t.node not in latest:
            latest[t.node] = t
    return [latest[n] for n in sorted(latest)]


@dataclass(frozen=True)
class Report:
    """One report folder (`lmedge reproduce` / `lmedge bench` / `lmedge demo` output).

    `problem` says why the folder cannot be shown (its `summary.json`
    unreadable, or a row without a field the page shows); it is then shown
    as unreadable, with no rows and no figures, and the other reports as usual.
    """

    name: str
    path: Path
    runs: list[dict[str, Any]]
    scenarios: list[dict[str, Any]]
    figures: list[str] = field(default_factory=list)
    problem: str | None = None


#: Figures a report folder may hold, by extension.
FIGURE_SUFFIXES: Final = (".svg", ".png")
#: A figure's file name: plain characters only (it goes into a URL and a header).
_FIGURE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
#: Largest figure served, bytes: the bench's PNGs are a few hundred KiB.
MAX_FIGURE_BYTES: Final = 16 * 1024 * 1024
#: The fields of a scenario row the reports page shows, each a number or null.
REPORT_FIELDS: Final = (
    "objective",
    "jain",
    "mean_latency_s",
    "success_ratio",
    "rejected_ratio",
    "conflict_ratio",
)


def find_reports(roots: Sequence[Path]) -> dict[str, Path]:
    """Report folders (holding a `summary.json`) in or below `roots`, by display name.

    A root that is itself a report is listed under its own name; below a root
    the search goes two levels deep (`reports/<name>/summary.json`,
    `reports/<group>/<name>/summary.json`).
    """
    found: dict[str, Path] = {}
    for root in roots:
        candidates = [root, *root.glob("*/"), *root.glob("*/*/")]
        for folder in candidates:
            if (folder / "summary.json").is_file():
                name = folder.name if folder == root else str(folder.relative_to(root.parent))
                found.setdefault(name, folder)
    return dict(sorted(found.items()))


def _scenario_rows(payload: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The runs and the scenario rows of a `summary.json`; `ValueError` naming what is wrong."""
    if not isinstance(payload, dict):
        raise ValueError("it is not a JSON object")
    runs = payload.get("runs", [])
    by_scenario = payload.get("scenarios", {})
    if not isinstance(runs, list) or not isinstance(by_scenario, dict):
        raise ValueError("`runs` is not a list or `scenarios` not an object")
    # {scenario: {policy: means over seeds}} (lmedge.bench.report.aggregate), one row each
    rows = []
    for sc, by_policy in by_scenario.items():
        if not isinstance(by_policy, dict):
            raise ValueError(f"scenario {sc!r} is not an object")
        for policy, row in by_policy.items():
            if not isinstance(row, dict):
                raise ValueError(f"{sc}/{policy} is not an object")
            for key in REPORT_FIELDS:
                value = row.get(key, "missing")
                if value is not None and (
                    isinstance(value, bool) or not isinstance(value, int | float)
                ):
                    shown = "missing" if key not in row else f"{value!r}, not a number"
                    raise ValueError(f"{sc}/{policy} field {key!r} is {shown}")
            rows.append({"scenario": sc, "policy": policy, **row})
    return [r for r in runs if isinstance(r, dict)], rows


def _figures(path: Path) -> list[str]:
    """The report's figures: regular files (not links) directly in `path`, plainly named."""
    figures = sorted(
        p.name
        for p in path.iterdir()
        if p.suffix in FIGURE_SUFFIXES
        and _FIGURE_NAME.match(p.name)
        and stat.S_ISREG(p.lstat().st_mode)
    )
    # An SVG and a PNG of one figure: show the SVG only.
    stems = {Path(f).stem for f in figures if f.endswith(".svg")}
    return [f for f in figures if f.endswith(".svg") or Path(f).stem not in stems]


def load_report(name: str, folders: dict[str, Path]) -> Report:
    """The report `name`; `NotFound` when it is not one of `folders`.

    A report whose `summary.json` cannot be read or shown comes back with
    its `problem` set rather than raising: one bad folder must not hide the others.
    """
    if name not in folders:
        known = ", ".join(list(folders)[:5]) or "none"
        raise NotFound(f"no report {name!r} (reports: {known})")
    path = folders[name]
    try:
        payload = json.loads((path / "summary.json").read_text())
        runs, scenarios = _scenario_rows(payload)
        figures = _figures(path)
    except (OSError, ValueError) as exc:
        problem = f"{path / 'summary.json'} is unreadable ({exc})"
        return Report(name=name, path=path, runs=[], scenarios=[], problem=problem)
    return Report(name=name, path=path, runs=runs, scenarios=scenarios, figures=figures)


def report_file(report: Report, filename: str) -> Path:
    """A figure of `report`; `NotFound` for anything else (no path escapes the folder)."""
    if filename not in report.figures:
        raise NotFound(f"report {report.name!r} has no figure {filename!r}")
    return report.path / filename


def read_figure(report: Report, filename: str) -> bytes:
    """The bytes of a figure of `report`: a regular file in its folder, opened without
    following a link (one swapped in after the listing is refused too); `NotFound` else."""
    path = report_file(report, filename)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        raise NotFound(f"report {report.name!r} has no figure {filename!r}") from exc
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_FIGURE_BYTES:
            raise NotFound(f"report {report.name!r} has no figure {filename!r} to serve")
        return f.read(MAX_FIGURE_BYTES + 1)
