"""The slot/epoch control loop (docs/design.md "Control loop", paper Fig. 4).

One `ControlLoop` drives one `ClusterBackend` with one set of plugins. Per
slot t (length `ClusterContext.slot_s`):

1. snapshot S_t (the state at the end of t-1) and the slot's arrivals;
2. at an epoch boundary (every `epoch_slots` slots) the planner, with the
   static context, the random-policy baseline, the last epoch's metrics, the
   previous macro policy, episodic memory and the traffic per LM; validated
   with `check_macro_policy`, replaced by the random baseline when invalid;
3. the router; validated with `check_routing_map`, replaced by local routing;
   the map is published;
4. once routing is done (paper Fig. 4, T2.7), one deployer per worker node,
   given its role intent and its node state with the backlog the routing map
   just created: `NodeState.backlog` is the snapshot's queue plus the prompts
   routed to the node this slot, per serving LM (`routed_backlog`), so a
   deployer never switches off an LM that the router has just sent work to
   for want of seeing it. Validated with `check_placement`, mapped to
   `nearest_feasible` (outcome `replaced`, violations kept; LMs in the role
   intent, then those with the most backlog, are the last switched off),
   else a feasible fallback; then actuated;
5. the clock advances to the slot end (the emulator runs its events); the
   finished requests are drained, queued for the store with the slot's
   decisions and telemetry (`recording.py`: sent as a few batch inserts every
   `store_every` slots: 1 on a cluster, more in the emulator where slots take
   milliseconds), and fed to plugins implementing `FeedbackConsumer`;
6. at an epoch end, `EpochMetrics` over the requests finished in the epoch
   and a `MemoryCase`.

Every plugin call goes through one `DecisionGuard` (guard.py: call,
validate, repair with the role priority, last-resort fallback, stamp), the
same one the node agents use for their deployers.

Before all of it the loop follows the cluster (`ClusterBackend.refresh`):
a changed context replaces `ctx` from this slot on, and a change that can
invalidate the macro policy (`ContextUpdate.needs_replan`) re-plans at once,
the planner's decision audited with the changes as its `trigger`. A planner
that reads traffic (`Capabilities.reads_traffic`) and made its plan without
any (the first) is asked again once `FIRST_TRAFFIC_SLOTS` slots have traffic,
and its plans see the last epoch's traffic plus this epoch's so far (every
other planner sees the last epoch's).

A run that lasts weeks (the controller on a cluster) must not grow:
`keep_history=False` keeps no per-request or per-slot history in the
`RunResult` (records, decisions, placements, actuations, timings; only the
last `MAX_EPOCHS_KEPT` epochs' metrics), and the episodic memory handed to
the planner is bounded. Records still reach the store, feedback, a
`RunRecorder` (a run's summary computed as it goes) and the epoch metrics,
one slot at a time; the epoch metrics are running sums (`WindowTally`), not
the epoch's records.

Planning may run beside the slot loop (`background_planning=True`, the
cluster path; `planning.py`): at an epoch boundary the observation is taken in the loop
and the planner runs in a thread; the router and deployers keep using the
previous macro policy until the new one has been validated, and it applies
from the next slot start after that. With `plan_lag_slots=k` it applies
exactly k slots after the boundary, waiting for it then if need be, so a
run on virtual time stays deterministic.

Contracts for plugin authors:

- Plugins are pure and never read a clock: the loop stamps every `Decision`
  with run, epoch, slot, node, `latency_s` (wall time of the call, measured
  with `time.perf_counter`) and `sim_time_s` (the backend clock).
- A plugin that raises, or returns something that is not a `Decision` of the
  right kind, is replaced by the fallback and audited with the error; the
  loop never crashes on a plugin.
- Deployers run in a thread pool (one thread per worker node, capped at
  `max_workers`) when any of them declares `Capabilities(io_bound=True)`,
  e.g. an LLM agent waiting on HTTP; otherwise sequentially, which is faster
  for pure rules. Either way results are collected in node order.
- Feedback: the planner and router receive every finished request; a node's
  deployer receives those whose destination is its node.

The loop knows only `lmedge.api` protocols and the store, so the Kubernetes
path reuses it unchanged.
"""

from __future__ import annotations

import logging
import random
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol, cast, runtime_checkable

from lmedge.api import (
    ActuationResult,
    Arrival,
    ClusterBackend,
    ClusterContext,
    Decision,
    EpochMetrics,
    FeedbackConsumer,
    MacroPolicy,
    MemoryCase,
    NodeInfo,
    NodeObservation,
    Placement,
    PlanningObservation,
    RequestRecord,
    RequestRouter,
    Route,
    RoutingMap,
    SlotObservation,
    Snapshot,
    capabilities_of,
)
from lmedge.api.feasibility import check_macro_policy
from lmedge.api.runconfig import PolicyConfig
from lmedge.controller.assembly import PolicyPlugins, derive_seed
from lmedge.controller.gctune import quiet_gc, slot_end
from lmedge.controller.guard import DecisionGuard
from lmedge.controller.planning import (
    MEMORY_CASES,
    PlannerThread,
    memory_cases,
    observe,
    replan_reason,
)
from lmedge.controller.prometheus import ControlPlaneMetrics
from lmedge.controller.recording import StoreWriter
from lmedge.metrics import WindowTally, lms_named
from lmedge.policies.classes import class_arrivals, lm_arrivals, routes_for_classes
from lmedge.store import Store

log = logging.getLogger(__name__)

#: Most deployer threads, whatever the node count: LLM endpoints throttle anyway.
MAX_DEPLOYER_THREADS = 16
#: Epoch metrics a run without history keeps (the newest): 2,000 epochs are
#: 35 days of 25-minute epochs; the store has all of them.
MAX_EPOCHS_KEPT = 2000
#: Slots with arrivals after which a plan made without traffic (the run's first,
#: for a planner that `reads_traffic`) is re-made from what arrived. Two 30-s slots
#: show every LM with more than a few prompts a slot; the first epoch otherwise
#: runs the planner's prior for its 50 slots.
FIRST_TRAFFIC_SLOTS = 2


@runtime_checkable
class RoutesAtGateways(Protocol):
    """A backend whose gateways route request by request (a cluster's).

    `route_requests_at_gateways` makes every later routing push carry what a
    gateway needs to build `policy`'s router and run it on windows of
    `window_s` seconds (at most `most` requests a call): `RequestRouting`.
    """

    def route_requests_at_gateways(
        self, policy: PolicyConfig, window_s: float, most: int
    ) -> None: ...


@dataclass
class SlotTiming:
    """Wall time spent deciding in one slot (seconds); not part of any result JSON.

    `deployers_s` sums `node_s`, each node's whole guarded deployer decision
    (call, validation, repair, stamp): the work a node agent does for its
    own node on a cluster, in parallel with the others. `decide_s -
    deployers_s` is then the controller's serial part (snapshot, planner on
    epoch slots, router, validation, publication).
    """

    slot: int
    planner_s: float = 0.0
    router_s: float = 0.0
    deployers_s: float = 0.0
    decide_s: float = 0.0
    store_s: float = 0.0
    node_s: list[float] = field(default_factory=list)
    node_cpu_s: list[float] = field(default_factory=list)  # the same decisions' thread CPU
    #: CPU time of the loop's thread over the same spans (on a loaded machine
    #: wall time also counts the waits for a core)
    decide_cpu_s: float = 0.0
    deployers_cpu_s: float = 0.0


class RunRecorder(Protocol):
    """Follows a run slot by slot, e.g. to compute its summary without keeping its history.

    The loop calls it in this order each slot: `placed` for every actuated
    placement, then `finished` with the records drained at the slot end and
    the context in force in that slot, `decided` with the slot's decisions,
    and `timed`; `decided` once more at `close` for a plan that finished then.
    """

    def placed(self, slot: int, actuation: ActuationResult) -> None: ...

    def finished(
        self, slot: int, ctx: ClusterContext, records: Sequence[RequestRecord]
    ) -> None: ...

    def decided(self, decisions: Sequence[Decision[Any]]) -> None: ...

    def timed(self, timing: SlotTiming) -> None: ...


@dataclass
class RunResult:
    """Everything a run produced, for metrics, reports and tests."""

    run_id: str
    policy: str
    context: ClusterContext
    slots: int
    records: list[RequestRecord] = field(default_factory=list)
    epochs: list[EpochMetrics] = field(default_factory=list)
    decisions: list[Decision[Any]] = field(default_factory=list)
    placements: list[Placement] = field(default_factory=list)
    placement_slots: list[int] = field(default_factory=list)
    actuations: list[ActuationResult] = field(default_factory=list)
    timings: list[SlotTiming] = field(default_factory=list)
    settle_slots: int = 0

    def measured_records(self) -> list[RequestRecord]:
        """Records of requests that arrived in the measured slots (not while settling)."""
        return [r for r in self.records if r.slot < self.slots]


class ControlLoop:
    """Drives `backend` with `plugins` slot by slot; see the module docstring."""

    def __init__(
        self,
        backend: ClusterBackend,
        plugins: PolicyPlugins,
        *,
        run_id: str,
        seed: int = 0,
        store: Store | None = None,
        baseline: EpochMetrics | None = None,
        memory: Sequence[MemoryCase] = (),
        max_workers: int = MAX_DEPLOYER_THREADS,
        keep_decisions: bool = True,
        keep_history: bool = True,
        store_every: int = 1,
        telemetry: bool = True,
        store_records: bool = True,
        background_planning: bool = False,
        plan_lag_slots: int | None = None,
        metrics: ControlPlaneMetrics | None = None,
        recorder: RunRecorder | None = None,
    ) -> None:
        if plan_lag_slots is not None and plan_lag_slots < 0:
            raise ValueError(f"plan_lag_slots must be >= 0, got {plan_lag_slots}")
        self.backend = backend
        self.plugins = plugins
        self.metrics = metrics
        self.ctx = backend.context()
        self.run_id = run_id
        self.store = store
        self.baseline = baseline
        self.guard = DecisionGuard(
            run_id, backend.clock, seed_rng=random.Random(derive_seed(seed, "fallback-planner"))
        )
        self._memory: list[MemoryCase] = list(memory)
        self._macro: MacroPolicy | None = None
        self._placements: dict[str, Placement] = {}
        # the epoch's metrics as running sums, never its requests (~500,000 at 1,000 workers)
        self._epoch_tally = _epoch_tally(self.ctx)
        self._recorder = recorder
        self._epoch_traffic: dict[str, int] = {}
        # requests routed this epoch, and those sent off-role (the planner sees the ratio)
        self._epoch_routed = 0
        self._epoch_off_role = 0
        self._consumers: dict[type, bool] = {}  # deployer class -> is a FeedbackConsumer
        self._last_traffic: dict[str, int] = {}
        # the plan in force was made without traffic, and the planner reads it:
        # re-plan after FIRST_TRAFFIC_SLOTS slots with arrivals (Capabilities.reads_traffic)
        self._reads_traffic = capabilities_of(plugins.planner).reads_traffic
        self._planned_blind = False
        self._traffic_slots = 0
        self._last_metrics: EpochMetrics | None = None
        self._keep_history = keep_history
        self._keep_decisions = keep_decisions and keep_history
        # store_records=False: the records were read from the store (a cluster's
        # gateways stored them); storing each again only costs the server a
        # duplicate check per record.
        self._writer = StoreWriter(
            store, run_id, backend.telemetry if telemetry else None, store_every, store_records
        )
        self._workers = [n for n in self.ctx.workers if n.name in plugins.deployers]
        io_bound = any(capabilities_of(d).io_bound for d in plugins.deployers.values())
        threads = min(max(len(self._workers), 1), max_workers)
        self._pool = ThreadPoolExecutor(threads, "deployer") if io_bound else None
        # background planning: one planner thread, one plan in flight at most
        self._planning = (
            PlannerThread(plugins.planner, self._plan, self._planning_observation, plan_lag_slots)
            if background_planning or plan_lag_slots is not None
            else None
        )
        self.result = RunResult(run_id, plugins.name, self.ctx, 0)
        self._install_request_router()

    def _install_request_router(self) -> None:
        """Hand a request-level router to a backend that can route per window.

        The emulator calls this process's router (`route_requests_with`); a
        cluster's gateways each build the same router from the run's policy
        (`RoutesAtGateways`: the push carries it with the slot's map). Any
        other backend keeps using the router's slot map.
        """
        router = self.plugins.router
        caps = capabilities_of(router)
        if not caps.routes_requests:
            return
        install = getattr(self.backend, "route_requests_with", None)
        if install is not None and isinstance(router, RequestRouter):
            install(router.route_requests, caps.window_s, caps.window_requests)
        elif isinstance(self.backend, RoutesAtGateways) and self.plugins.choice is not None:
            policy = self.plugins.choice.config(self.plugins.seed)
            self.backend.route_requests_at_gateways(policy, caps.window_s, caps.window_requests)

    # -- the loop ---------------------------------------------------------------

    def run(
        self,
        slots: int,
        on_slot: Callable[[int], None] | None = None,
        *,
        settle_slots: int = 0,
    ) -> RunResult:
        """Run slots 0..slots-1, then `settle_slots` more, and return what happened.

        Settling keeps the loop (and the workload) going so that the requests of
        the measured slots reach an outcome; `RunResult.slots` stays `slots`,
        and reports count only records with `slot < slots`.
        """
        try:
            with quiet_gc():
                for t in range(slots + settle_slots):
                    self.step(t)
                    if on_slot is not None:
                        on_slot(t)
        finally:
            self.close()
        self.result.slots = slots
        self.result.settle_slots = settle_slots
        return self.result

    def close(self) -> None:
        """Send what is still unsent to the store and stop the deployer and planner threads.

        Safe to call more than once, and after a failed `step`. A plan still in
        flight is awaited (its call is bounded by the planner's own budget) and
        recorded, never applied: the audit keeps every decision that was made.
        """
        try:
            d = self._planning.close() if self._planning is not None else None
            if d is not None:
                self._writer.hold(d)
                if self._recorder is not None:
                    self._recorder.decided([d])
                if self._keep_decisions:
                    self.result.decisions.append(d)
            self._writer.flush()
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
            if self._planning is not None:
                self._planning.close()
            self._pool = self._planning = None

    def resume(self, macro: MacroPolicy) -> bool:
        """Continue a run mid-epoch with the macro policy it stored (a restarted controller).

        The policy is used until the next epoch's plan if it still fits the
        cluster; False (and no policy) when it does not, e.g. an LMService it
        names was deleted while no controller ran.
        """
        if check_macro_policy(macro, self.ctx):
            return False
        self._macro = macro
        return True

    def step(self, slot: int) -> None:
        """One slot: follow the cluster, decide, actuate, advance the clock, record."""
        update = self.backend.refresh(slot)
        if update.changed:
            self.ctx = update.context
            self._workers = [n for n in self.ctx.workers if n.name in self.plugins.deployers]
            self._placements = {k: v for k, v in self._placements.items() if self.ctx.has_node(k)}
            self._epoch_tally.use_deadlines(self.ctx.loop.tau_s, _deadlines(self.ctx))
        ctx = self.ctx
        epoch = slot // ctx.loop.epoch_slots
        timing = SlotTiming(slot)
        started, started_cpu = time.perf_counter(), time.thread_time()
        snapshot = self.backend.snapshot(slot)
        arrivals = self.backend.arrivals(slot)
        decisions: list[Decision[Any]] = []
        trigger = replan_reason(update) if update.needs_replan else None
        if trigger is None and self._planned_blind and self._traffic_slots >= FIRST_TRAFFIC_SLOTS:
            trigger = f"first traffic: {self._traffic_slots} slots seen"
        if slot % ctx.loop.epoch_slots == 0 or trigger is not None:
            if self._planning is None:
                d_plan = self._plan(self._planning_observation(epoch), slot, trigger)
                self._macro = d_plan.value
                timing.planner_s = d_plan.latency_s
                decisions.append(d_plan)
            else:
                self._planning.submit(epoch, slot, trigger)
        if self._planning is not None:
            d_done = self._collect_plan(self._planning, slot)
            if d_done is not None:
                timing.planner_s = d_done.latency_s
                decisions.append(d_done)
        d_route = self._route(epoch, slot, snapshot, arrivals)
        timing.router_s = d_route.latency_s
        decisions.append(d_route)
        self.backend.publish_routing(slot, d_route.value)
        tally = tally_routes(d_route.value, arrivals)
        self._count_off_role(d_route.value, arrivals, tally)
        backlog = routed_backlog(snapshot, d_route.value, arrivals, tally)
        deploy_cpu = time.thread_time()
        d_places = self._deploy(epoch, slot, backlog, timing.node_s, timing.node_cpu_s)
        timing.deployers_s = sum(timing.node_s)
        timing.deployers_cpu_s = time.thread_time() - deploy_cpu
        decisions.extend(d_places)
        timing.decide_s = time.perf_counter() - started
        timing.decide_cpu_s = time.thread_time() - started_cpu
        for d in d_places:
            self._placements[d.value.node] = d.value
            actuation = self.backend.apply_placement(d.value)
            if self._recorder is not None:
                self._recorder.placed(slot, actuation)
            if self._keep_history:
                self.result.placements.append(d.value)
                self.result.placement_slots.append(slot)
                self.result.actuations.append(actuation)
        self._traffic_slots += any(a.prompts > 0 for a in arrivals)
        for a in arrivals:
            # planners plan LMs: a request class counts as its first model's traffic
            lm = a.lm if self.ctx.has_service(a.lm) else self.ctx.default_model(a.lm) or a.lm
            self._epoch_traffic[lm] = self._epoch_traffic.get(lm, 0) + a.prompts

        del snapshot, arrivals, tally, backlog  # not walked by the collection below
        # After actuating, before the slot's wait: idle time for a controller on a
        # cluster. The full collection once an epoch runs just after the epoch's
        # metric rows were let go, so it does not walk them.
        slot_end(full=slot > 0 and slot % ctx.loop.epoch_slots == 0)
        self.backend.clock.sleep_until((slot + 1) * ctx.loop.slot_s)
        records = self.backend.drain_records()
        for r in records:
            if not r.run:
                r.run = self.run_id
        stored = time.perf_counter()
        self._writer.record(slot, records, decisions)
        timing.store_s = time.perf_counter() - stored
        if self.metrics is not None:
            self.metrics.observe_decisions(decisions)
            self.metrics.observe_slot(slot, timing.decide_s)
        self._feedback(records)
        for r in records:
            self._epoch_tally.add(r)
        if self._recorder is not None:
            self._recorder.finished(slot, ctx, records)
            self._recorder.decided(decisions)
            self._recorder.timed(timing)
        if self._keep_history:
            self.result.records.extend(records)
            self.result.timings.append(timing)
        if self._keep_decisions:
            self.result.decisions.extend(decisions)
        self.result.slots = slot + 1
        if (slot + 1) % ctx.loop.epoch_slots == 0:
            self._end_epoch(epoch)

    # -- the three tiers ----------------------------------------------------------

    def _planning_observation(self, epoch: int) -> PlanningObservation:
        """What the planner sees, taken in the loop (so a planner thread reads no loop state)."""
        traffic = Counter(self._last_traffic)
        if self._reads_traffic:
            traffic += Counter(self._epoch_traffic)
        self._planned_blind = self._reads_traffic and not traffic
        return PlanningObservation(
            epoch=epoch,
            context=self.ctx,
            baseline=self.baseline,
            last=self._last_metrics,
            previous=self._macro,
            memory=memory_cases(self._memory),
            # for a planner that reads traffic, the last epoch's and this one's so far: a
            # re-plan mid-epoch (churn, an LMService applied) plans for the newest traffic
            traffic=dict(sorted(traffic.items())),
        )

    def _plan(
        self, obs: PlanningObservation, slot: int, trigger: str | None
    ) -> Decision[MacroPolicy]:
        d = self.guard.plan(self.plugins.planner, obs, slot=slot)
        return d.model_copy(update={"trigger": trigger}) if trigger else d

    def _collect_plan(self, planning: PlannerThread, slot: int) -> Decision[MacroPolicy] | None:
        """The plan that takes effect at this slot start, if one does, put in force."""
        d = planning.collect(slot)
        if d is None:
            return None
        self._macro = d.value
        planning.applied(slot // self.ctx.loop.epoch_slots, slot)
        return d

    def _route(
        self, epoch: int, slot: int, snapshot: Snapshot, arrivals: list[Arrival]
    ) -> Decision[RoutingMap]:
        router = self.plugins.router
        # A router that knows only LMs sees each request class as its first model
        # (lmedge.policies.classes); `cema` chooses the model itself.
        by_class = capabilities_of(router).routes_request_classes
        obs = SlotObservation(
            slot=slot,
            epoch=epoch,
            context=self.ctx,
            macro=self._macro,
            snapshot=snapshot,
            arrivals=arrivals if by_class else lm_arrivals(self.ctx, arrivals),
        )
        classes = not by_class and bool(class_arrivals(self.ctx, arrivals))

        def decide() -> Decision[RoutingMap]:
            d = router.route(obs)
            if classes and isinstance(d, Decision) and isinstance(d.value, RoutingMap):
                # inside the guarded call: a value this step cannot handle is a failure
                d = d.model_copy(update={"value": routes_for_classes(self.ctx, d.value, arrivals)})
            return d

        return self.guard.route(router, decide, self.ctx, arrivals, epoch=epoch, slot=slot)

    def _deploy(
        self,
        epoch: int,
        slot: int,
        snapshot: Snapshot,
        node_s: list[float],
        node_cpu_s: list[float],
    ) -> list[Decision[Placement]]:
        """One guarded decision per worker, in node order; each one's wall and CPU time kept."""
        states = {n.name: n for n in snapshot.nodes}
        roles = self._macro.role_map() if self._macro else {}
        modes = self._macro.mode_map() if self._macro else {}
        services = self.ctx.services

        def one(node: NodeInfo) -> tuple[Decision[Placement], float, float]:
            started, started_cpu = time.perf_counter(), time.thread_time()
            state = states.get(node.name)
            obs = (
                None
                if state is None
                else NodeObservation(
                    slot=slot,
                    epoch=epoch,
                    node=node,
                    services=services,
                    roles=roles.get(node.name, []),
                    modes=modes.get(node.name, {}),
                    state=state,
                    previous=self._placements.get(node.name),
                    tau_s=self.ctx.loop.tau_s,
                    slot_s=self.ctx.loop.slot_s,
                )
            )
            deployer = self.plugins.deployers[node.name]
            d = self.guard.place(deployer, node, services, obs, epoch=epoch, slot=slot)
            return d, time.perf_counter() - started, time.thread_time() - started_cpu

        done = (
            [one(n) for n in self._workers]
            if self._pool is None
            else list(self._pool.map(one, self._workers))
        )
        node_s.extend(t for _, t, _ in done)
        node_cpu_s.extend(c for _, _, c in done)
        return [d for d, _, _ in done]

    # -- records, feedback, epochs -------------------------------------------------

    def _feedback(self, records: list[RequestRecord]) -> None:
        if not records:
            return
        planner = self.plugins.planner
        if isinstance(planner, FeedbackConsumer):
            if self._planning is not None and self._planning.planning:
                # the planner is planning in its thread: learn after it is done
                self._planning.defer_feedback(records)
            else:
                observe(planner, records)
        if isinstance(self.plugins.router, FeedbackConsumer):
            observe(self.plugins.router, records)
        by_node: dict[str, list[RequestRecord]] | None = None
        for node, deployer in self.plugins.deployers.items():
            # a runtime Protocol check walks the protocol's members: once per class
            kind = type(deployer)
            consumes = self._consumers.get(kind)
            if consumes is None:
                consumes = self._consumers[kind] = isinstance(deployer, FeedbackConsumer)
            if not consumes:
                continue
            if by_node is None:
                by_node = {}
                for r in records:
                    by_node.setdefault(r.destination, []).append(r)
            mine = by_node.get(node)
            if mine:
                observe(cast(FeedbackConsumer, deployer), mine)

    def _count_off_role(
        self,
        routing: RoutingMap,
        arrivals: Sequence[Arrival],
        tally: RoutedTally | None = None,
    ) -> None:
        """Count requests routed to a node whose role intent leaves out their LM.

        The paper's planner is told "the micro router had an off-role ratio of
        x%" (§V-D2): how far the slot-level router strayed from the macro
        policy's node roles. Only the loop sees both, so it measures it here.
        `tally` is `tally_routes(routing, arrivals)` when the caller has it.
        """
        if self._macro is None:
            return
        roles = self._macro.role_map()
        counted = tally_routes(routing, arrivals) if tally is None else tally
        for (node, lm), requests in counted.requests.items():
            self._epoch_routed += requests
            if lm not in roles.get(node, ()):
                self._epoch_off_role += requests

    def epoch_metrics(self) -> EpochMetrics:
        """The metrics of the epoch under way: its requests that finished so far.

        At an epoch's end they are that epoch's (`RunResult.epochs`); before it,
        those of a shorter window, e.g. a random baseline measured over fewer
        slots than an epoch.
        """
        ctx = self.ctx
        tally = self._epoch_tally
        metrics = tally.metrics(lms_named(ctx, tally.names), ctx.loop.lam)
        if self._epoch_routed:
            ratio = self._epoch_off_role / self._epoch_routed
            metrics = metrics.model_copy(update={"off_role_ratio": round(ratio, 6)})
        return metrics

    def _end_epoch(self, epoch: int) -> None:
        ctx = self.ctx
        metrics = self.epoch_metrics()
        self._epoch_routed = self._epoch_off_role = 0
        self.result.epochs.append(metrics)
        if not self._keep_history and len(self.result.epochs) > MAX_EPOCHS_KEPT:
            del self.result.epochs[: len(self.result.epochs) - MAX_EPOCHS_KEPT]
        if self._macro is not None:
            case = MemoryCase(
                run=self.run_id,
                epoch=epoch,
                traffic=dict(sorted(self._epoch_traffic.items())),
                policy=self._macro,
                metrics=metrics,
                objective=metrics.objective,
            )
            self._memory.append(case)
            if len(self._memory) > 2 * MEMORY_CASES:
                # what `memory_cases` can ever return: the best and the worst
                self._memory = memory_cases(self._memory)
            if self.store is not None:
                try:
                    self.store.record_memory(case)
                except Exception:  # the loop goes on; the case stays in memory
                    log.exception("run %s: memory case of epoch %d not stored", self.run_id, epoch)
        self._last_metrics = metrics
        self._last_traffic = self._epoch_traffic
        self._epoch_traffic = {}
        self._traffic_slots = 0
        self._epoch_tally = _epoch_tally(ctx)


def _deadlines(ctx: ClusterContext) -> dict[str, float]:
    return {lm: ctx.deadline_s(lm) for lm in ctx.lm_names}


def _epoch_tally(ctx: ClusterContext) -> WindowTally:
    """An epoch's metrics, each request counted with the deadlines in force when it finished."""
    return WindowTally(tau_s=ctx.loop.tau_s, deadlines=_deadlines(ctx))


def route_index(routing: RoutingMap) -> dict[tuple[str, str], Route]:
    """The routing map's routes by (origin, LM or request class)."""
    return {(r.origin, r.lm): r for r in routing.routes}


class RoutedTally(NamedTuple):
    """One pass over a slot's arrivals through its routing map.

    `requests`: requests routed per (destination, serving LM), arrivals with
    at least one request. `prompts`: prompts routed per destination and
    serving LM, in the order the arrivals first reach each (arrivals with at
    least one request and one prompt); what `routed_backlog` adds.
    """

    requests: dict[tuple[str, str], int]
    prompts: dict[str, dict[str, int]]


def tally_routes(routing: RoutingMap, arrivals: Sequence[Arrival]) -> RoutedTally:
    """Walk `arrivals` once through `routing` (see `RoutedTally`); unrouted arrivals are skipped."""
    routes = route_index(routing)
    requests: dict[tuple[str, str], int] = {}
    prompts: dict[str, dict[str, int]] = {}
    for a in arrivals:
        route = routes.get((a.origin, a.lm))
        if route is None or a.requests <= 0:
            continue
        key = (route.destination, route.serving_lm)
        requests[key] = requests.get(key, 0) + a.requests
        if a.prompts > 0:
            per = prompts.setdefault(route.destination, {})
            per[route.serving_lm] = per.get(route.serving_lm, 0) + a.prompts
    return RoutedTally(requests, prompts)


def routed_backlog(
    snapshot: Snapshot,
    routing: RoutingMap,
    arrivals: Sequence[Arrival],
    tally: RoutedTally | None = None,
) -> Snapshot:
    """`snapshot` with this slot's routed prompts added to each destination's backlog.

    The deployers decide after the router (paper Fig. 4, T2.7), so what they
    must keep serving is the queue at the slot start plus what the routing map
    has just sent there; counted per serving LM (a request class counts as the
    model its route names). Routes to a node the snapshot lacks are ignored
    (that node has no deployer observation to update). `tally` is
    `tally_routes(routing, arrivals)` when the caller has it already.
    """
    added = (tally_routes(routing, arrivals) if tally is None else tally).prompts
    if not added:
        return snapshot
    nodes = []
    for n in snapshot.nodes:
        extra = added.get(n.name)
        if extra:
            backlog = dict(n.backlog)
            for lm, k in extra.items():
                backlog[lm] = backlog.get(lm, 0) + k
            n = n.model_copy(update={"backlog": backlog})
        nodes.append(n)
    return snapshot.model_copy(update={"nodes": nodes})
