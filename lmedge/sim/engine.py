"""The discrete-event engine of the emulated edge cluster (SimPy virtual time).

Entities: nodes with per-LM FIFO queues of prompt sets (jobs), at most one
model instance (pod) per node and LM, with a mode (gpu/cpu), CPU cores and
vGPU slots bound to physical GPUs. A request (one set of K prompts for one LM
from one origin) travels: uplink -> queue at the destination (waiting,
including any cold start) -> inference, one prompt at a time -> downlink.

Speed: there is no SimPy process per request or prompt. Each prompt is one
timeout whose callback carries a token; when the set of busy pods on a node
changes, every busy pod's progress is advanced at its old rate and its
completion rescheduled at the new one (processor sharing), and stale
timeouts are ignored by their token.

Rules the real cluster imposes and the engine reproduces:

- Cold start: a started pod is *pending* for a sampled cold-start time
  (`coldstart.py`), then serves its node's queue for its LM.
- The pending rule: while any pod on a node is pending, actions that create a
  pod there (start, resize, mode change) are voided; stops still apply.
- Resizing an instance (other mode, cores or vGPUs) restarts it: on
  Kubernetes a pod's requests are immutable, so it is a new pod with a cold start.
- Deactivation mid-set keeps the set's progress: completed prompts stay done,
  the in-flight prompt is lost and restarts, and the set goes back to the
  head of its queue to resume when the LM is activated again.
- A request routed to a node where its LM has no pod waits there and counts as
  a conflict; it succeeds if the LM is activated before the deadline.
- Request classes: a request of a class several LMs serve joins the queue of
  the model its route names (`Route.model`) and uses that model's pod,
  profile and deadline; an unmapped class (or a route whose model does not
  serve it or cannot run at the destination) goes to the class's first model
  (`ClusterContext.default_model`) at the local, else nearest, node. Its
  record keeps `lm` = the class and `model` = the serving LM.
- Deadline: a request not finished (downlink included) by submit + tau is
  removed and recorded as a timeout with latency tau; the stage it was in
  absorbs the remainder so the stages sum to tau exactly.
- Admission control: a request whose (origin, class) pair the slot's map
  rejects is recorded `rejected` the moment it arrives, with latency 0 and
  destination = origin: the origin's gateway refuses it from the map it
  already holds, before any uplink (on the cluster that refusal is an HTTP
  429 taking a few milliseconds, which the emulator rounds to 0). It takes
  no queue place and no service time.
- Cluster events (the scenario's timeline, `timeline.py`) take effect at a
  slot boundary, through `advance(slot)`: an LMService deleted ends its
  queued and in-service requests `lm_removed` and stops its pods; an edited
  one has its pods replaced (a new pod of the same shape, cold start, when it
  still fits; else stopped); a node down ends the requests queued or in
  service there, and those that later reach it, `node_lost`, and loses its
  pods (it comes back empty). A request whose origin is down is `node_lost` at
  once (its gateway is gone), as is a response delivered to a down origin; a
  response already on its way back from a node that then fails still arrives.
  A request of a class no LM in force serves (a trace row) is `lm_removed` at
  once. No request vanishes: each ends in exactly one record.

This module holds what moves in virtual time: the SimPy process and
callbacks (arrivals, cold starts, prompts, deliveries, deadlines) and the
state changes they make. The entities are in `entities.py`, the placement
rules in `actuation.py`, the pods' speeds under contention in
`contention.py`, and what the cluster reports in `observation.py`; all four
are pure.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Generator
from functools import partial
from operator import attrgetter
from typing import NamedTuple

import numpy as np
import simpy

from lmedge.api.base import built
from lmedge.api.decisions import LMPlacement, Placement, Route, RoutingMap
from lmedge.api.engines import (
    GIB,
    DecodePoint,
    ThroughputProfile,
    TokenProfile,
    concurrent_requests,
    kv_capacity_tokens,
    mixed_batches,
    throughput_profile,
)
from lmedge.api.interfaces import ActuationResult
from lmedge.api.live import ContextChange
from lmedge.api.observations import (
    Arrival,
    ClusterContext,
    RequestWindow,
    ServiceInfo,
    Snapshot,
    WindowRequest,
)
from lmedge.api.records import NodeTelemetry, RequestOutcome, RequestRecord
from lmedge.api.resources import PowerProfile
from lmedge.sim import observation
from lmedge.sim.actuation import bind, invalid, misfit, pod_shape
from lmedge.sim.coldstart import fit_truncated_lognormal
from lmedge.sim.contention import busy_rates
from lmedge.sim.entities import (
    DONE,
    DOWNLINK,
    QUEUED,
    SERVING,
    UPLINK,
    Instance,
    Job,
    Mode,
    NodeSim,
)
from lmedge.sim.network import Network
from lmedge.sim.radio import server_positions, uplink_s
from lmedge.sim.scenario import Scenario
from lmedge.sim.servicemodel import amdahl, cpu_base_seconds, lognormal_unit
from lmedge.sim.tokens.batching import BatchingEngine, TokenRequest
from lmedge.sim.tokens.lengths import LengthSampler
from lmedge.sim.trace import RequestSpec
from lmedge.sim.workload import Workload

COLD_STREAM = 2
SERVICE_STREAM = 3
#: Token lengths of token-engine requests: a stream of its own, so that pipeline
#: scenarios draw exactly what they drew before token engines existed.
TOKEN_STREAM = 4
#: A context no length reaches: lengths are drawn unclipped, then clipped to the serving LM's.
_UNCLIPPED = 2**40
_OFFSET = attrgetter("offset_s")
#: What a node without a `power` profile draws.
_DEFAULT_POWER = PowerProfile()


class _ServedLM(NamedTuple):
    """What `_submit` and `_respond` read of a serving LM for every request: looked
    up once per LM while the LMs in force stay the same (`Emulator._served`)."""

    deadline_s: float
    tokens: TokenProfile | None
    request_kib: float
    response_kib: float


class Emulator:
    """The emulated cluster for one scenario and seed, driven in virtual time.

    Same scenario + seed + decisions -> identical records: every random draw
    comes from a seeded numpy stream (workload per slot, cold starts, service
    jitter) and every iteration order is a list or insertion-ordered dict.
    """

    def __init__(self, scenario: Scenario, seed: int) -> None:
        self.scenario = scenario
        self.seed = seed
        self.env = simpy.Environment()
        self.timeline = scenario.schedule
        self._step = 0  # index of the timeline step in force
        self._changes: list[ContextChange] = []  # applied, not yet reported by `take_changes`
        self._down: frozenset[str] = frozenset()
        self._contexts: dict[int, ClusterContext] = {}
        self.ctx: ClusterContext = scenario.context()
        self.em = scenario.spec.emulation
        self.slot_s = scenario.spec.loop.slot_s
        self.network = Network(scenario.nodes)
        self.workload = Workload(scenario, seed)
        # the LMs in force; every node keeps a queue for each LM the timeline ever names
        self.services: dict[str, ServiceInfo] = {s.name: s for s in scenario.services}
        lms = [s.name for s in self.timeline.all_services]
        self.nodes: dict[str, NodeSim] = {n.name: NodeSim(n, lms) for n in scenario.nodes}
        cs = self.em.cold_start
        self.cold = fit_truncated_lognormal(cs.median_s, cs.p95_s, cs.max_s)
        self.rng_cold = np.random.default_rng([seed, COLD_STREAM])
        self.rng_service = np.random.default_rng([seed, SERVICE_STREAM])
        self._jitter = lognormal_unit(self.em.service_time_cv) if self.em.service_time_cv else None
        self._routing: dict[int, dict[tuple[str, str], tuple[str, str]]] = {}
        self._rejected: dict[int, set[tuple[str, str]]] = {}
        # users with a wireless uplink (lmedge.sim.radio), and where the servers are
        users = scenario.spec.workload.users
        self._radio = users.radio if users is not None else None
        self._server_at = (
            server_positions(
                [n.name for n in scenario.nodes if n.spec.role == "worker"], users.area_m
            )
            if users is not None
            else {}
        )
        # (slot, token lengths of its requests by request id), drawn once for arrivals and submits
        self._slot_lengths: tuple[int, dict[str, list[tuple[int, int]]]] | None = None
        #: per slot boundary, per node running a token engine: (KV byte-seconds so far,
        #: KV tokens in use / pool of its fullest engine); see `kv_samples`
        self.kv_samples: list[dict[str, tuple[float, float]]] = []
        self._deadlines: dict[float, deque[Job]] = {}
        self._default: dict[tuple[str, str], str] = {}
        self._served_lms: dict[str, _ServedLM] = {}  # by serving LM, for `self.services`
        self._hostable = self._hostable_pairs()
        self._records: list[RequestRecord] = []
        # token engines (llama.cpp, vllm): lengths drawn per request class, sequences by id
        wl = scenario.spec.workload
        self._token_lms = {
            s.name for s in self.timeline.all_services if s.spec.engine.tokens is not None
        }
        self._lengths = LengthSampler(wl.token_lengths, scenario.folder)
        self._class_lengths = {
            cls: LengthSampler(spec, scenario.folder) for cls, spec in wl.lm_token_lengths.items()
        }
        self._seq_job: dict[int, Job] = {}
        #: request-level routing (`route_requests_with`): (router, window s, most a call)
        self._window_router: tuple[Callable[[RequestWindow], list[Route]], float, int] | None = None
        self.window_stats = {"windows": 0, "requests": 0, "fallbacks": 0, "decision_s": 0.0}
        self._next_seq = 0
        self.stats = {
            "submitted": 0,
            "rejected": 0,
            "node_lost": 0,
            "lm_removed": 0,
            "prompts_done": 0,
            "prompts_lost": 0,
            "cold_starts": 0,
        }
        self.env.process(self._arrival_process())

    def _hostable_pairs(self) -> set[tuple[str, str]]:
        ctx = self.ctx
        return {
            (n.name, lm) for lm in ctx.lm_names for n in ctx.workers if ctx.can_host(n.name, lm)
        }

    # ---------------------------------------------------------------- timeline
    def advance(self, slot: int) -> None:
        """Apply the timeline's events up to the start of `slot` (idempotent).

        Called by the backend's `refresh(slot)` and by the arrival process at
        every slot start, at the same virtual instant, so the changes land
        before the slot's requests whether or not a controller asks.
        """
        steps = self.timeline.steps
        while self._step + 1 < len(steps) and steps[self._step + 1].slot <= slot:
            self._step += 1
            self._enter(steps[self._step].slot)

    def take_changes(self) -> list[ContextChange]:
        """The changes applied since the last call."""
        out, self._changes = self._changes, []
        return out

    def _enter(self, slot: int) -> None:
        step = self.timeline.steps[self._step]
        old = self.services
        new = {s.name: s for s in step.services}
        for lm in [lm for lm in old if lm not in new]:
            for node in self.nodes.values():
                self._drop_lm(node, lm)
        lost = [n for n in step.down if n not in self._down]
        self._down = step.down
        for name in lost:
            self._drop_node(self.nodes[name])
        self.services = new
        self.ctx = self._context_at(slot)
        self.network = Network(step.nodes)
        self._default.clear()
        self._served_lms.clear()
        self._hostable = self._hostable_pairs()
        for lm, svc in new.items():
            if lm in old and old[lm].spec != svc.spec:
                for node in self.nodes.values():
                    self._replace(node, lm)
        self._changes.extend(step.changes)

    def _drop_lm(self, node: NodeSim, lm: str) -> None:
        """An LMService deleted: its requests here end `lm_removed`, its pod stops."""
        self._strand_queue(node, lm, "lm_removed")
        inst = node.instances.get(lm)
        if inst is not None:
            for job in _served(inst):
                self._strand(job, "lm_removed")
            self._stop(node, inst)

    def _drop_node(self, node: NodeSim) -> None:
        """A node lost: its queued and in-service requests end `node_lost`; no pod survives."""
        for lm in node.queues:
            self._strand_queue(node, lm, "node_lost")
        for inst in list(node.instances.values()):
            for job in _served(inst):
                self._strand(job, "node_lost")
            self._stop(node, inst)

    def _replace(self, node: NodeSim, lm: str) -> None:
        """An edited LMService: a new pod of the old shape (cold start) if it still fits."""
        inst = node.instances.get(lm)
        if inst is None:
            return
        shape = LMPlacement.model_construct(
            lm=lm, mode=inst.mode, cpu_cores=inst.cores, vgpus=inst.vgpus
        )
        self._stop(node, inst)  # an in-service set goes back to the head of its queue
        svc = self.services[lm]
        if not invalid(node, shape, svc) and not misfit(node, shape, svc.spec, releasing=None):
            self._start(node, shape)

    def _strand_queue(self, node: NodeSim, lm: str, outcome: RequestOutcome) -> None:
        q = node.queues[lm]
        for job in list(q):
            if job.state == QUEUED:
                self._strand(job, outcome)
        q.clear()

    def _strand(self, job: Job, outcome: RequestOutcome) -> None:
        """End a request the cluster took away from it (`node_lost`, `lm_removed`)."""
        self._detach(job)
        job.state = DONE
        self._record(job, outcome)

    def _detach(self, job: Job) -> int:
        """Take a queued or in-service job off its node, closing its open stage; its old state."""
        now = self.env.now
        state = job.state
        if state in (QUEUED, SERVING):
            self.nodes[job.dest].waiting[job.lm] -= job.prompts - job.done
        if state == QUEUED:
            job.queue_s += now - job.wait_since
        elif state == SERVING and (tok := job.inst) is not None and tok.engine is not None:
            engine = tok.engine
            self._close_attempt(job, now)
            for seq in job.seqs:
                if self._seq_job.pop(seq.rid, None) is not None:
                    engine.cancel(seq, now)
                job.board_s += seq.board_s
            job.seqs = []
            job.inst = None
            del tok.jobs[job]
            self._engine_changed(self.nodes[job.dest], tok)
        elif state == SERVING:
            job.infer_s += now - job.serve_since
            inst = job.inst
            job.inst = None
            if inst is not None:
                inst.job = None
                inst.token += 1
                node = self.nodes[job.dest]
                if not self._take_next(node, inst):
                    self._rebalance(node)
        return state

    # ----------------------------------------------------------------- workload
    def _context_at(self, slot: int) -> ClusterContext:
        step = self.timeline.step_at(slot).slot
        ctx = self._contexts.get(step)
        if ctx is None:
            ctx = self._contexts[step] = self.scenario.context(step)
        return ctx

    def _requests(self, slot: int) -> list[RequestSpec]:
        """The slot's requests. The generator draws for every class the timeline ever
        names but users only ask for services that exist: classes not in force are
        left out. A trace is replayed whole (a row for a missing class is recorded)."""
        rows = self.workload.slot(slot)
        if not self.timeline.changes or self.scenario.trace is not None:
            return rows
        ctx = self._context_at(slot)
        return [r for r in rows if ctx.is_request_class(r.lm)]

    def prepare(self, slot: int) -> None:
        """Draw `slot`'s requests now (cached: the same rows whenever they are drawn).

        The backend calls it at the slot boundary (`refresh`): the users' requests
        exist before the controller reads them, so drawing them is the
        emulator's work, not part of the controller's decision time, as on a
        cluster, where the controller only reads its gateways' reports.
        """
        self.workload.slot(slot)

    def arrivals(self, slot: int) -> list[Arrival]:
        """The requests of `slot` the cluster's gateways receive (not those at a down origin,
        nor of a class no LM in force serves: those are recorded, never routed)."""
        rows = self._requests(slot)
        if self.timeline.changes:
            ctx = self._context_at(slot)
            down = self.timeline.step_at(slot).down
            rows = [r for r in rows if r.origin not in down and ctx.is_request_class(r.lm)]
        lengths = self._lengths_of(slot)
        out = []
        for r in rows:
            rid = self._request_id(r)
            pairs = lengths.get(rid)
            out.append(
                built(
                    Arrival,
                    {
                        "origin": r.origin,
                        "lm": r.lm,
                        "requests": 1,
                        "prompts": r.prompts,
                        "request": rid,
                        "input_tokens": None if pairs is None else sum(i for i, _ in pairs),
                    },
                )
            )
        return out

    def _lengths_of(self, slot: int) -> dict[str, list[tuple[int, int]]]:
        """The token lengths of `slot`'s requests by request id (empty without token LMs).

        Drawn once a slot, for every request in submit order from the stream
        (seed, 4, slot): a request's lengths depend on the seed, its slot and the
        requests before it, never on decisions or on who asked first.
        """
        got = self._slot_lengths
        if got is not None and got[0] == slot:
            return got[1]
        table: dict[str, list[tuple[int, int]]] = {}
        if self._token_lms:
            rng = np.random.default_rng([self.seed, TOKEN_STREAM, slot])
            for r in sorted(self._requests(slot), key=_OFFSET):
                table[self._request_id(r)] = self._draw_lengths(rng, r)
        self._slot_lengths = (slot, table)
        return table

    def publish_routing(self, slot: int, routing: RoutingMap) -> None:
        """Install the slot's map: (origin, class) -> (destination, serving LM).

        A route whose serving LM (`Route.model`, else `lm`) does not serve the
        class, or cannot run on the destination, is ignored (default routing).
        Rejected pairs are refused on arrival (`_refuse`); a pair both routed
        and rejected (which validation never lets through) is routed.
        """
        table: dict[tuple[str, str], tuple[str, str]] = {}
        for r in routing.routes:
            model = r.serving_lm
            if (r.destination, model) in self._hostable and (
                model == r.lm or model in self.ctx.models_for(r.lm)
            ):
                table[(r.origin, r.lm)] = (r.destination, model)
        self._routing[slot] = table
        self._rejected[slot] = routing.rejected() - table.keys()
        for old in [s for s in self._routing if s < slot - 2]:
            del self._routing[old]
            self._rejected.pop(old, None)

    def default_destination(self, origin: str, lm: str) -> str:
        """Local if the origin can host the LM, else the nearest feasible worker.

        Nearest = lowest link latency (same site before cross site); ties go
        to the first node in manifest order. `lm` is the serving LM (for an
        unmapped request class, `ClusterContext.default_model` of the class).
        """
        key = (origin, lm)
        hit = self._default.get(key)
        if hit is None:
            if self.ctx.can_host(origin, lm):
                hit = origin
            else:
                feasible = self.ctx.feasible_nodes(lm)
                hit = min(feasible, key=lambda n: self.network.distance(origin, n))
            self._default[key] = hit
        return hit

    def _arrival_process(self) -> Generator[simpy.Event, None, None]:
        env = self.env
        slot = 0
        while True:
            start = slot * self.slot_s
            self.advance(slot)
            now = env.now
            # Every request of the slot is submitted here, at its own submit time:
            # what decides its fate (the slot's routing map, the nodes down, the LMs
            # in force) changes only at slot boundaries, so one event per request
            # (its arrival at the destination) replaces a submit and an arrival.
            # In submit order, so that each deadline FIFO stays in deadline order.
            if self._token_lms:
                self._sample_kv(now)
            lengths = self._lengths_of(slot)
            rows = sorted(self._requests(slot), key=_OFFSET)
            # each server's uplink band is shared by the requests sent to it in the slot
            sharing = self._uplink_sharing(rows) if self._radio is not None else None
            if self._window_router is not None:
                self._windows(
                    slot, start, [(r, lengths.get(self._request_id(r))) for r in rows], sharing
                )
            else:
                for r in rows:
                    at = now + max(0.0, start + r.offset_s - now)
                    pairs = lengths.get(self._request_id(r)) if lengths else None
                    self._submit(r, at, pairs, sharing)
            slot += 1
            yield env.timeout(max(0.0, slot * self.slot_s - env.now))

    def _draw_lengths(self, rng: np.random.Generator, r: RequestSpec) -> list[tuple[int, int]]:
        """The (input, output) tokens of `r`'s prompts, unclipped.

        Drawn for every request of the slot in submit order, whatever its fate
        and serving LM, so a request's lengths depend only on the seed, its
        slot and the requests before it in the slot, not on the decisions.
        """
        sampler = self._class_lengths.get(r.lm, self._lengths)
        inp, out = sampler.draw(rng, r.prompts, _UNCLIPPED)
        return list(zip(inp.tolist(), out.tolist(), strict=True))

    def route_requests_with(
        self, router: Callable[[RequestWindow], list[Route]], window_s: float, most: int
    ) -> None:
        """Route every request from now on in windows (request-level routing).

        The requests arriving in [k window_s, (k + 1) window_s) of a slot (at
        most `most` a call) are routed together at the window's end by
        `router`, and leave for their destinations then: the wait counts in
        their uplink. A window whose call raises, or answers with the wrong
        number of routes, keeps the slot's map, as does a route the
        destination cannot serve (`_submit`): no request is lost.
        """
        self._window_router = (router, window_s, most)

    def _windows(
        self,
        slot: int,
        start: float,
        rows: list[tuple[RequestSpec, list[tuple[int, int]] | None]],
        sharing: dict[str, int] | None,
    ) -> None:
        """Schedule the slot's windows: each routes its requests at its end.

        A user's uplink band is shared by the requests of the slot sent to its
        server (`sharing`): counted by the slot's map at first, each window
        moves its requests to the servers it routed them to before they leave,
        so with one window a slot the count is exact.
        """
        _, window_s, most = self._window_router or (None, 1.0, 128)
        groups: dict[int, list[tuple[RequestSpec, list[tuple[int, int]] | None]]] = {}
        for row in rows:
            groups.setdefault(int(row[0].offset_s // window_s), []).append(row)
        now = self.env.now
        for k, members in groups.items():
            t0 = start + k * window_s
            t1 = min(start + (k + 1) * window_s, start + self.slot_s)
            for i in range(0, len(members), most):
                self.env.timeout(max(0.0, t1 - now)).callbacks.append(
                    partial(self._route_window, slot, t0, members[i : i + most], sharing)
                )

    def _route_window(
        self,
        slot: int,
        t0: float,
        members: list[tuple[RequestSpec, list[tuple[int, int]] | None]],
        sharing: dict[str, int] | None,
        _ev: object = None,
    ) -> None:
        router = self._window_router[0] if self._window_router else None
        now = self.env.now
        window = built(
            RequestWindow,
            {
                "slot": slot,
                "start_s": t0,
                "end_s": now,
                "context": self.ctx,
                "snapshot": self.snapshot(slot),
                "requests": [
                    built(
                        WindowRequest,
                        {
                            "id": self._request_id(r),
                            "origin": r.origin,
                            "lm": r.lm,
                            "prompts": r.prompts,
                            "submit_s": slot * self.slot_s + r.offset_s,
                            "input_tokens": sum(i for i, _ in lengths) if lengths else None,
                            "output_tokens": sum(o for _, o in lengths) if lengths else None,
                        },
                    )
                    for r, lengths in members
                ],
            },
        )
        routes: list[Route] | None = None
        started = time.perf_counter()
        try:
            routes = router(window) if router is not None else None
        except Exception:  # the router failed: the slot's map routes the window
            routes = None
        self.window_stats["decision_s"] += time.perf_counter() - started
        self.window_stats["windows"] += 1
        self.window_stats["requests"] += len(members)
        if routes is None or len(routes) != len(members):
            self.window_stats["fallbacks"] += 1
            routes = None
        chosen = [
            None if routes is None else (routes[k].destination, routes[k].serving_lm)
            for k in range(len(members))
        ]
        if sharing is not None and routes is not None:
            self._reshare(sharing, [r for r, _ in members], chosen)
        for (r, lengths), route in zip(members, chosen, strict=True):
            self._submit(r, slot * self.slot_s + r.offset_s, lengths, sharing, route, now)

    def _reshare(
        self,
        sharing: dict[str, int],
        rows: list[RequestSpec],
        routes: list[tuple[str, str] | None],
    ) -> None:
        """Move each user's request from the server the slot's map sent it to (where
        `_uplink_sharing` counted it) to the one its window chose."""
        for r, route in zip(rows, routes, strict=True):
            if r.user < 0:
                continue
            was, now = self._destination(r), self._destination(r, route)
            if isinstance(was, tuple) and isinstance(now, tuple) and was[0] != now[0]:
                # a timeline step at the window's end may have moved the map's answer
                sharing[was[0]] = max(sharing.get(was[0], 1) - 1, 0)
                sharing[now[0]] = sharing.get(now[0], 0) + 1

    def _destination(
        self, r: RequestSpec, route: tuple[str, str] | None = None
    ) -> tuple[str, str] | RequestOutcome:
        """(destination, serving LM) of `r`, or the outcome it is refused with at once.

        Its routing window's `route` if it can follow it, else its (origin,
        class) route, else its class's first model at the local or nearest node.
        Pure: the same answer whenever it is asked in the slot.
        """
        if r.origin in self._down:
            return "node_lost"  # the origin's gateway is gone
        if (r.origin, r.lm) in self._rejected.get(r.slot, ()):
            return "rejected"
        if route is not None and self._serves(r, route):
            return route  # its routing window's answer
        hit = self._routing.get(r.slot, {}).get((r.origin, r.lm))
        if hit is not None and hit in self._hostable:
            return hit
        # an unmapped class is served by its first model, at the local/nearest node
        found = self.ctx.default_model(r.lm)
        if found is None:
            return "lm_removed"  # no LM in force serves the class
        if not self.ctx.feasible_nodes(found):
            return "node_lost"  # every node that could host it is down
        return self.default_destination(r.origin, found), found

    def _serves(self, r: RequestSpec, hit: tuple[str, str]) -> bool:
        """Whether (destination, model) is hosted and the model serves `r`'s class."""
        return hit in self._hostable and (hit[1] == r.lm or hit[1] in self.ctx.models_for(r.lm))

    def _uplink_sharing(self, rows: list[RequestSpec]) -> dict[str, int]:
        """Requests of users sent to each server in the slot (they share its uplink band)."""
        n: dict[str, int] = {}
        for r in rows:
            if r.user >= 0:
                hit = self._destination(r)
                if isinstance(hit, tuple):
                    n[hit[0]] = n.get(hit[0], 0) + 1
        return n

    def _submit(
        self,
        r: RequestSpec,
        at: float,
        lengths: list[tuple[int, int]] | None = None,
        sharing: dict[str, int] | None = None,
        route: tuple[str, str] | None = None,
        depart: float | None = None,
    ) -> None:
        """Submit `r` at time `at` (now or later in the slot): refuse it, or start its uplink.

        A user's request (`r.user >= 0`) goes up the wireless channel of
        `lmedge.sim.radio`, its server's band shared by `sharing[dest]`
        requests, and has no downlink; any other crosses the wired network.
        `route` (destination, serving LM) overrides the slot's map when the
        destination can serve it; `depart` (its routing window's end) is when
        its uplink starts.
        """
        env = self.env
        hit = self._destination(r, route)
        if not isinstance(hit, tuple):
            self._refuse(r, at, hit)
            return
        dest, model = hit
        served = self._served(model)
        tau = served.deadline_s
        job = Job(self._request_id(r), r, dest, model, at, at + tau)
        self.stats["submitted"] += 1
        tokens = served.tokens
        if tokens is not None:
            ctx_len = tokens.context_tokens
            pairs = lengths or [(70, 215)] * r.prompts
            clipped = [(min(i, ctx_len - 1), 0) for i, _ in pairs]
            job.lengths = [
                (i, min(o, ctx_len - i)) for (i, _), (_, o) in zip(clipped, pairs, strict=True)
            ]
            job.tok_in = sum(i for i, _ in job.lengths)
            job.tok_out = sum(o for _, o in job.lengths)
        if r.user >= 0 and self._radio is not None:
            job.wireless = True
            tokens_in = job.tok_in if job.lengths else 70 * r.prompts
            job.uplink_s = uplink_s(
                self._radio,
                (r.x_m, r.y_m),
                self._server_at[dest],
                tokens_in,
                (sharing or {}).get(dest, 1),
            )
        else:
            job.uplink_s = self.network.delay(r.origin, dest, served.request_kib * r.prompts)
        if depart is not None:
            job.route_wait_s = depart - at  # the wait for its routing window
            job.uplink_s += job.route_wait_s
        self._watch_deadline(job, tau)
        now = env.now
        arrive = at + job.uplink_s
        if arrive > now:
            env.timeout(arrive - now).callbacks.append(partial(self._arrive, job))
        else:
            self._arrive(job)

    def _served(self, model: str) -> _ServedLM:
        """The deadline, token profile and payload sizes of `model`, an LM in force."""
        got = self._served_lms.get(model)
        if got is None:
            spec = self.services[model].spec
            got = self._served_lms[model] = _ServedLM(
                self.ctx.deadline_s(model),
                spec.engine.tokens,
                spec.profile.request_kib,
                spec.profile.response_kib,
            )
        return got

    def _request_id(self, r: RequestSpec) -> str:
        """The record id of a request (served or refused alike); `Arrival.request`."""
        if r.user >= 0:
            return f"{self.seed}-{r.slot}-u{r.user}-{r.lm}"
        return f"{self.seed}-{r.slot}-{r.origin}-{r.lm}"

    def _refuse(self, r: RequestSpec, at: float, outcome: RequestOutcome = "rejected") -> None:
        """Record a request ended at once, at its origin, unserved: refused by admission
        control (`rejected`), or with no cluster to take it (`node_lost`, `lm_removed`)."""
        self.stats["submitted"] += 1
        self.stats[outcome] += 1
        self._records.append(observation.refusal_record(self._request_id(r), r, at, outcome))

    # -------------------------------------------------------------- job flow
    def _arrive(self, job: Job, _ev: object = None) -> None:
        if job.state == DONE:
            return
        if job.dest in self._down or job.lm not in self.services:
            self._strand(job, "node_lost" if job.dest in self._down else "lm_removed")
            return
        node = self.nodes[job.dest]
        inst = node.instances.get(job.lm)
        job.conflict = inst is None
        job.state = QUEUED
        job.wait_since = self.env.now
        node.queues[job.lm].append(job)
        node.waiting[job.lm] += job.prompts - job.done
        if inst is not None and inst.ready and inst.job is None and self._take_next(node, inst):
            self._rebalance(node)

    def _take_next(self, node: NodeSim, inst: Instance) -> bool:
        """Give an idle ready pod the next job of its queue; True if it got one.

        A token pod takes every queued job at once (its engine queues their
        sequences) and reschedules itself: it answers False.
        """
        if inst.engine is not None:
            self._feed(node, inst)
            return False
        q = node.queues[inst.lm]
        while q and q[0].state != QUEUED:
            q.popleft()
        if not q:
            return False
        job = q.popleft()
        now = self.env.now
        job.state = SERVING
        job.queue_s += now - job.wait_since
        job.serve_since = now
        job.mode = inst.mode
        job.inst = inst
        inst.job = job
        self._new_prompt(inst)
        return True

    def _new_prompt(self, inst: Instance) -> None:
        work = inst.base_s
        if self._jitter is not None:
            mu, sigma = self._jitter
            work *= math.exp(mu + sigma * float(self.rng_service.standard_normal()))
        inst.work_left = work
        inst.since = self.env.now
        inst.token += 1
        if inst.rate > 0:
            self.env.timeout(work / inst.rate).callbacks.append(
                partial(self._prompt_done, inst, inst.token)
            )

    def _prompt_done(self, inst: Instance, token: int, _ev: object = None) -> None:
        if token != inst.token or inst.job is None:
            return
        job = inst.job
        job.done += 1
        self.nodes[job.dest].waiting[job.lm] -= 1
        self.stats["prompts_done"] += 1
        inst.work_left = 0.0
        if job.done < job.prompts:
            self._new_prompt(inst)
            return
        now = self.env.now
        job.infer_s += now - job.serve_since
        job.inst = None
        inst.job = None
        self._respond(job, now)
        node = self.nodes[job.dest]
        if not self._take_next(node, inst):
            self._rebalance(node)

    def _respond(self, job: Job, now: float) -> None:
        """`job` is served: its response starts back to the origin (a user's has no downlink)."""
        job.downlink_s = (
            0.0
            if job.wireless
            else self.network.delay(
                job.dest, job.origin, self._served(job.lm).response_kib * job.prompts
            )
        )
        job.state = DOWNLINK
        job.down_since = now
        if job.downlink_s > 0:
            self.env.timeout(job.downlink_s).callbacks.append(partial(self._delivered, job))
        else:
            self._delivered(job)

    # ----------------------------------------------------------- token engines
    def _feed(self, node: NodeSim, inst: Instance) -> None:
        """Hand every queued job of a ready token pod's LM to its engine, one sequence per prompt.

        The time a job waited in the node's queue is queue time, and so is the
        time its first sequence then waits for KV admission (`_close_attempt`).
        """
        engine = inst.engine
        assert engine is not None
        q = node.queues[inst.lm]
        now = self.env.now
        took = False
        cap = engine.kv_capacity_tokens
        while q:
            job = q.popleft()
            if job.state != QUEUED:
                continue
            took = True
            job.state = SERVING
            job.queue_s += now - job.wait_since
            job.serve_since = now
            job.mode = inst.mode
            job.inst = inst
            inst.jobs[job] = None
            for i, o in job.lengths or ():
                i = min(i, cap - 1)
                seq = TokenRequest(self._next_seq, now, i, min(o, cap - i))
                self._next_seq += 1
                self._seq_job[seq.rid] = job
                job.seqs.append(seq)
                engine.submit(seq, now)
        if took:
            self._engine_changed(node, inst)

    def _engine_changed(self, node: NodeSim, inst: Instance) -> None:
        """After a token pod's engine changed: rebalance the node if it went busy or idle,
        and schedule the engine's next event."""
        engine = inst.engine
        assert engine is not None
        if engine.busy != inst.engine_busy:
            inst.engine_busy = engine.busy
            self._rebalance(node)
        self._schedule_engine(node, inst)

    def _schedule_engine(self, node: NodeSim, inst: Instance) -> None:
        assert inst.engine is not None
        inst.token += 1
        t = inst.engine.next_event_time()
        if t is not None:
            self.env.timeout(max(0.0, t - self.env.now)).callbacks.append(
                partial(self._engine_event, node, inst, inst.token)
            )

    def _engine_event(self, node: NodeSim, inst: Instance, token: int, _ev: object = None) -> None:
        """A token pod's engine step ended: finished sequences leave, the next step is scheduled."""
        if token != inst.token or inst.engine is None or node.instances.get(inst.lm) is not inst:
            return
        now = self.env.now
        for seq in inst.engine.advance(now):
            self._seq_done(node, inst, seq, now)
        self._engine_changed(node, inst)

    def _seq_done(self, node: NodeSim, inst: Instance, seq: TokenRequest, now: float) -> None:
        job = self._seq_job.pop(seq.rid, None)
        if job is None:
            return
        job.done += 1
        node.waiting[job.lm] -= 1
        self.stats["prompts_done"] += 1
        job.board_s += seq.board_s
        job.tpot_num += seq.finish_s - seq.first_token_s
        job.tpot_den += max(0, seq.output_tokens - 1)
        if job.done < job.prompts:
            return
        self._close_attempt(job, now)
        job.seqs = []
        job.inst = None
        del inst.jobs[job]
        # TTFT: submit to the first token at the origin (one link latency back)
        back = 0.0 if job.wireless else self.network.delay(job.dest, job.origin, 0.0)
        job.ttft_s = job.first_s - job.submit + back
        self._respond(job, now)

    def _close_attempt(self, job: Job, now: float) -> None:
        """Split the time since `job` entered its pod's engine into queue (waiting for KV
        admission), prefill (its first sequence's admission to its first token) and
        decode (the rest); inference = prefill + decode over every attempt."""
        admitted = [s.admitted_s for s in job.seqs if s.admitted_s == s.admitted_s]
        if not admitted:
            job.queue_s += now - job.serve_since
        else:
            a = min(admitted)
            job.queue_s += a - job.serve_since
            first = min(
                (s.first_token_s for s in job.seqs if s.first_token_s <= now), default=math.inf
            )
            if first < math.inf:
                job.prefill_s += first - a
                job.decode_s += now - first
                job.first_s = min(job.first_s, first)
            else:
                job.prefill_s += now - a
        job.infer_s = job.prefill_s + job.decode_s

    def _delivered(self, job: Job, _ev: object = None) -> None:
        if job.state != DOWNLINK:
            return
        job.state = DONE
        self._record(job, "node_lost" if job.origin in self._down else "success")

    def _watch_deadline(self, job: Job, tau: float) -> None:
        """Expire `job` at its deadline with one timer per deadline length, not one per job.

        Jobs are submitted in time order, so for one tau their deadlines are in
        order too: a FIFO per tau and a single pending timeout at its head's
        deadline keep the event heap and the live objects (which Python's GC
        walks) at one entry per job instead of three.
        """
        q = self._deadlines.get(tau)
        if q is None:
            q = self._deadlines[tau] = deque()
        q.append(job)
        if len(q) == 1:
            due = max(0.0, job.deadline - self.env.now)
            self.env.timeout(due).callbacks.append(partial(self._deadline_due, q))

    def _deadline_due(self, q: deque[Job], _ev: object = None) -> None:
        now = self.env.now
        while q and q[0].deadline <= now:
            self._expire(q.popleft())
        while q and q[0].state == DONE:
            q.popleft()  # served already: drop it now rather than at its deadline
        if q:
            self.env.timeout(q[0].deadline - now).callbacks.append(partial(self._deadline_due, q))

    def _expire(self, job: Job, _ev: object = None) -> None:
        if job.state == DONE:
            return
        tau = job.deadline - job.submit
        state = self._detach(job)
        # the stage the request was in absorbs float drift: stages sum to tau
        if state == UPLINK:
            job.uplink_s, job.queue_s, job.infer_s, job.downlink_s = tau, 0.0, 0.0, 0.0
        elif state == QUEUED:
            job.queue_s = max(0.0, tau - job.uplink_s - job.infer_s)
        elif state == SERVING:
            job.infer_s = max(0.0, tau - job.uplink_s - job.queue_s)
        else:
            job.downlink_s = max(0.0, tau - job.uplink_s - job.queue_s - job.infer_s)
        job.state = DONE
        if state == QUEUED:
            # deadlines are nearly FIFO, so expired sets gather at the head: trim them
            # there, or a queue whose LM never comes back would grow without bound
            q = self.nodes[job.dest].queues[job.lm]
            while q and q[0].state == DONE:
                q.popleft()
        self._record(job, "timeout")

    def _record(self, job: Job, outcome: RequestOutcome) -> None:
        self._records.append(observation.job_record(job, outcome, self._busy_watts(job)))

    def _busy_watts(self, job: Job) -> float:
        """Board power x utilization of `job`'s node in the mode it ran in (0 if it never ran)."""
        if job.mode not in ("gpu", "cpu"):
            return 0.0
        power = self.nodes[job.dest].spec.power or _DEFAULT_POWER
        if job.mode == "gpu":
            return power.busy_watts_per_gpu * power.utilization
        cores = self.services[job.lm].spec.default_cpu_cores if job.lm in self.services else 1.0
        return power.busy_watts_per_core * cores * power.utilization

    def drain_records(self) -> list[RequestRecord]:
        out, self._records = self._records, []
        return out

    # ------------------------------------------------------------ contention
    def _rebalance(self, node: NodeSim) -> None:
        """Recompute every busy pod's rate on `node` after its busy set changed."""
        now = self.env.now
        node.integrate(now)
        for i, rate in busy_rates(node, self.em):
            if rate == i.rate:
                continue
            if i.engine is not None:
                i.engine.set_share(rate, now)
                i.rate = rate
                self._schedule_engine(node, i)
                continue
            if i.rate > 0:
                i.work_left = max(0.0, i.work_left - i.rate * (now - i.since))
            i.rate = rate
            i.since = now
            i.token += 1
            self.env.timeout(i.work_left / rate).callbacks.append(
                partial(self._prompt_done, i, i.token)
            )

    # ------------------------------------------------------------- actuation
    def apply_placement(self, placement: Placement) -> ActuationResult:
        """Start, stop or resize pods on one node (see the module docstring for the rules).

        Order, as a cluster's reconciler (`pods.plan_node`): stops first, then
        every pod being resized is stopped, then the new pods start in
        placement order, each checked against the node's free cores, memory,
        vGPU slots and vRAM (a misfit is reported in `errors` and not
        applied), so a swap between two pods lands whatever their order. The pending rule
        looks at the node as it was when the call began, so one placement may
        start several pods. LMs the placement omits are left as they are.
        """
        res = ActuationResult(node=placement.node)
        node = self.nodes.get(placement.node)
        if node is None:
            res.errors.append(f"unknown node {placement.node!r}")
            return res
        if node.name in self._down:
            res.errors.append(f"{node.name} is down")
            return res
        pending = node.pending
        starts: list[LMPlacement] = []
        for p in placement.lms:
            if p.lm not in self.services:
                res.errors.append(f"unknown LM {p.lm!r}")
                continue
            cur = node.instances.get(p.lm)
            if p.mode == "off":
                if cur is not None:
                    self._stop(node, cur)
                    res.stopped.append(p.lm)
                continue
            if cur is not None and (cur.mode, cur.cores, cur.vgpus) == pod_shape(p):
                continue
            if pending:
                res.voided.append(p.lm)
                continue
            why = invalid(node, p, self.services[p.lm])
            if why:
                res.errors.append(why)
                continue
            starts.append(p)
        for p in starts:  # as a cluster's reconciler: every replaced pod goes first
            cur = node.instances.get(p.lm)
            if cur is not None:
                self._stop(node, cur)
                res.resized.append(p.lm)
        for p in starts:
            why = misfit(node, p, self.services[p.lm].spec, releasing=None)
            if why:
                res.errors.append(why)
                continue
            if p.lm not in res.resized:
                res.started.append(p.lm)
            self._start(node, p)
        return res

    def _start(self, node: NodeSim, p: LMPlacement) -> None:
        svc = self.services[p.lm].spec
        mode: Mode = "gpu" if p.mode == "gpu" else "cpu"
        if mode == "gpu":
            binding = bind(node, p.vgpus, self.em.gpu_binding)
            base = svc.profile.gpu_seconds_per_prompt
            vram = svc.min_vram_gib
        else:
            binding = []
            cpu_s = svc.profile.cpu_seconds_per_prompt or svc.profile.gpu_seconds_per_prompt
            base = cpu_base_seconds(
                cpu_s, svc.default_cpu_cores, p.cpu_cores, self.em.cpu_parallel_fraction
            )
            vram = 0.0
        inst = Instance(
            p.lm,
            mode,
            p.cpu_cores,
            p.vgpus if mode == "gpu" else 0,
            binding,
            base,
            svc.deployment_memory_gib,
            vram,
        )
        tokens = svc.engine.tokens
        if tokens is not None:
            prof = throughput_profile(svc, node.spec, mode)
            assert prof is not None  # hostability (`fits`) requires one
            if mode == "cpu":
                # the CPU profile is at defaultCpuCores: Amdahl-scaled as a pipeline pod's time
                pf = self.em.cpu_parallel_fraction
                prof = _scaled(prof, amdahl(p.cpu_cores, pf) / amdahl(svc.default_cpu_cores, pf))
            inst.engine = BatchingEngine(
                prof,
                kv_capacity_tokens(svc, mode),
                concurrent_requests(svc, mode),  # the pod's batch slots, as on a cluster
                self.env.now,
                mixed=mixed_batches(svc.engine.kind),
            )
            inst.kv_bytes = tokens.kv_bytes_per_token
        for g, s in binding:
            node.slots_used[g] += s
        node.instances[p.lm] = inst
        cold = self.cold.sample(self.rng_cold)
        self.stats["cold_starts"] += 1
        inst.ready_at = self.env.now + cold
        self.env.timeout(cold).callbacks.append(partial(self._ready, node, inst, inst.token))
        self._rebalance(node)

    def _ready(self, node: NodeSim, inst: Instance, token: int, _ev: object = None) -> None:
        if token != inst.token or node.instances.get(inst.lm) is not inst:
            return
        inst.ready = True
        if self._take_next(node, inst):
            self._rebalance(node)

    def _stop(self, node: NodeSim, inst: Instance) -> None:
        if inst.engine is not None:
            self._stop_engine(node, inst)
        job = inst.job
        if job is not None:
            # the in-flight prompt is lost and restarts; completed prompts stay done
            now = self.env.now
            job.infer_s += now - job.serve_since
            job.state = QUEUED
            job.wait_since = now
            job.inst = None
            node.queues[job.lm].appendleft(job)
            self.stats["prompts_lost"] += 1
        inst.job = None
        inst.token += 1
        inst.rate = 0.0
        for g, s in inst.binding:
            node.slots_used[g] -= s
        del node.instances[inst.lm]
        self._rebalance(node)

    def _stop_engine(self, node: NodeSim, inst: Instance) -> None:
        """A token pod stops: its requests go back to the head of the queue, in order.

        Finished sequences stay done; the others (admitted or waiting) start
        over on the next pod; each admitted one counts as a prompt lost.
        """
        engine = inst.engine
        assert engine is not None
        now = self.env.now
        node.kv_byte_s_done += engine.kv_token_s_at(now) * inst.kv_bytes
        q = node.queues[inst.lm]
        for job in reversed(list(inst.jobs)):
            self._close_attempt(job, now)
            left = [s for s in job.seqs if self._seq_job.pop(s.rid, None) is not None]
            job.board_s += sum(engine.board_s_at(s, now) for s in left)
            self.stats["prompts_lost"] += sum(1 for s in left if s.admitted_s == s.admitted_s)
            job.lengths = [(s.input_tokens, s.output_tokens) for s in left]
            job.seqs = []
            job.state = QUEUED
            job.wait_since = now
            job.inst = None
            q.appendleft(job)
        inst.jobs.clear()
        inst.engine_busy = False

    # ------------------------------------------------------------ observation
    def snapshot(self, slot: int) -> Snapshot:
        up = [n for n in self.nodes.values() if n.name not in self._down]
        return observation.snapshot(up, self.services, slot, self.env.now)

    def telemetry(self) -> list[NodeTelemetry]:
        up = [n for n in self.nodes.values() if n.name not in self._down]
        return observation.telemetry(up, self.env.now)

    def _sample_kv(self, now: float) -> None:
        """Append a `kv_samples` entry: each node with a token engine, at `now`."""
        sample: dict[str, tuple[float, float]] = {}
        for n in self.nodes.values():
            engines = [i.engine for i in n.instances.values() if i.engine is not None]
            if engines or n.kv_byte_s_done:
                usage = max((e.kv_used_tokens / e.kv_capacity_tokens for e in engines), default=0.0)
                sample[n.name] = (n.kv_byte_s(now), usage)
        self.kv_samples.append(sample)

    def kv_gib_s(self) -> dict[str, float]:
        """KV memory-time (GiB-seconds) so far of every node that ran a token engine."""
        now = self.env.now
        return {
            n.name: n.kv_byte_s(now) / GIB
            for n in self.nodes.values()
            if n.kv_byte_s_done or any(i.engine is not None for i in n.instances.values())
        }

    def run_until(self, t: float) -> None:
        if t > self.env.now:
            self.env.run(until=t)


def _served(inst: Instance) -> list[Job]:
    """The requests a pod is serving: its prompt set, or a token pod's engine's requests."""
    if inst.job is not None:
        return [inst.job]
    return list(inst.jobs)


def _scaled(prof: ThroughputProfile, factor: float) -> ThroughputProfile:
    """`prof` with prefill and every decode point `factor` times as fast."""
    return ThroughputProfile(
        prefill_tokens_per_s=prof.prefill_tokens_per_s * factor,
        decode=[
            DecodePoint(running=d.running, tokens_per_s=d.tokens_per_s * factor)
            for d in prof.decode
        ],
    )
