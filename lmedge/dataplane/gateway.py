"""The gateway's core: route, forward or queue, time, record — no web framework.

Two roles in one object, as every worker node is both:

* origin (`submit`): a prompt set arrives from a user; look up the destination
  in the slot's routing map, hand the set to the destination's gateway (or to
  the local queues), and when the result is back build the `RequestRecord`
  with all four stage times and hand it to the record sink. Before its
  first routing map, a gateway holds the sets it cannot serve itself until
  that map (or a local pod of the LM) arrives, within their deadline;
* destination (`accept`): a set arrives from an origin; queue it FIFO for the
  LM's local model pod and answer with the queue and inference times.

Admission control happens at the origin: when the slot's map rejects this
node's requests for the LM, `submit` records the set with outcome `rejected`
(no queue, no forwarding) and raises `Rejected`, which the HTTP layer turns
into a 429 with `Retry-After` (what is left of the map's slot).

Streams (`open_stream` at the origin, `accept_stream` at the destination) take
the same route: admission and routing when opened (a refusal raises
`Rejected` before any byte), then the destination's events (`StreamStart`
when its pod is taken, `StreamText` pieces, one `StreamEnd`) pass through the
origin piece by piece. The destination queues a stream like a set
(`LMQueues.lease`) and streams from its pod through the pod's protocol
adapter (`lmedge.dataplane.engines`). The origin writes the record when the
stream ends: `success`, `failed` (the engine refused it or broke off, a peer
broke off), `timeout`, or `cancelled` when its consumer closed it (the client
left), which closes the upstream and so frees the destination's pod. Streams
are not held for a first routing map: with none they are served locally.

The HTTP layer (`lmedge.dataplane.app`) only parses and renders. Clock, peers'
client, model client and sink are injected, so unit tests drive this class
with plain fakes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import re
import time
import uuid
from collections import Counter, OrderedDict
from collections.abc import AsyncGenerator, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NoReturn, Protocol, TypeVar

from lmedge.api.constants import TAU_S
from lmedge.api.decisions import Route
from lmedge.api.inference import Prompt
from lmedge.api.observations import ServiceInfo, WindowRequest
from lmedge.api.records import RequestOutcome, RequestRecord
from lmedge.api.resources import Modality
from lmedge.dataplane.engines import EngineCall, Finish, Piece, pod_protocol
from lmedge.dataplane.metrics import GatewayMetrics
from lmedge.dataplane.queues import ENGINE_MODE, LMQueues, LocalModels, ModelCaller, PodLease
from lmedge.dataplane.records import RecordSink
from lmedge.dataplane.routing import RoutingTable
from lmedge.dataplane.timing import (
    StreamClock,
    build_record,
    record_total,
    split_stages,
    stream_record,
)
from lmedge.dataplane.windows import RequestWindows, RouterBuilder, SeedBuilder
from lmedge.dataplane.wire import (
    ForwardRequest,
    ForwardResult,
    GatewayStatus,
    PromptSetResult,
    RoutingUpdate,
    StreamEnd,
    StreamForward,
    StreamStart,
    StreamText,
)
from lmedge.dataplane.wire import (
    LocalModels as LocalModelsMessage,
)
from lmedge.errors import (
    BadRequest,
    ConfigError,
    DuplicateRequestId,
    ModelFailed,
    ModelUnavailable,
    Rejected,
    TransientError,
    UnknownLM,
)

__all__ = [
    "DuplicateRequestId",
    "Gateway",
    "GatewaySettings",
    "OpenedStream",
    "PeerCaller",
    "Rejected",
    "UnknownLM",
]

#: Client-chosen request ids a gateway remembers (the most recent ones) to
#: refuse their reuse; ~10 MB. Past it a reused id is still never lost: its
#: record's store id also names the origin node and the run, and a second,
#: different record under one id is refused and reported by the store.
REMEMBERED_IDS = 100_000

log = logging.getLogger(__name__)

T = TypeVar("T")

#: The error of a set given up on because the gateway is shutting down.
SHUTTING_DOWN = "gateway shutting down"


class PeerCaller(Protocol):
    """Forwards a set to another node's gateway (the httpx client in production)."""

    async def forward(
        self, base_url: str, request: ForwardRequest, timeout_s: float
    ) -> ForwardResult: ...

    def forward_stream(
        self, base_url: str, request: StreamForward, timeout_s: float
    ) -> AsyncGenerator[StreamStart | StreamText | StreamEnd, None]:
        """The destination's stream events, ending with its `StreamEnd`; `PeerUnavailable`."""
        ...


@dataclass(frozen=True)
class OpenedStream:
    """A stream admitted at the origin: its id, the LM serving it, and its events
    (`StreamText` pieces, then one `StreamEnd`). Closing `events` early cancels it."""

    id: str
    model: str
    destination: str
    events: AsyncGenerator[StreamText | StreamEnd, None]


@dataclass(frozen=True)
class GatewaySettings:
    """How one node's gateway is set up.

    `services`: LM service name -> modality (from the LMService manifests).
    `peers`: node name -> base URL of that node's gateway; `peer_url_template`
    (e.g. `http://{node}.lmedge-gateway:8080`) covers nodes not listed.
    `model_urls`: LM -> URL of a model pod on this node at start (the node agent
    replaces the set later with `PUT /control/models`).
    `tau_s`: request deadline, seconds, until a routing push carries the run's
    (`RunConfig.loop.tau_s`); default the paper's 900 s.
    `grace_s`: how long past tau an origin waits for a destination to report
    its timeout before giving up on it, seconds (default 5).
    `run`: run id stamped on records until the controller pushes one.
    `classes`: request class -> the LM services that serve it (their
    LMService `serves`), in manifest order. A request naming a class is served
    by the LM the routing map's `Route.model` chose for (this node, class),
    else by the class's first LM, as in the emulator; all of a class's LMs
    must share one modality.
    """

    node: str
    services: Mapping[str, Modality]
    classes: Mapping[str, Sequence[str]] = field(default_factory=dict)
    peers: Mapping[str, str] = field(default_factory=dict)
    peer_url_template: str | None = None
    model_urls: Mapping[str, str] = field(default_factory=dict)
    tau_s: float = TAU_S
    grace_s: float = 5.0
    run: str = ""

    def __post_init__(self) -> None:
        if not 0 < self.tau_s < math.inf:  # `not x > 0` also refuses nan
            raise ConfigError(f"tau must be positive and finite, got {self.tau_s}")
        if not _NODE_NAME.fullmatch(self.node):
            raise ConfigError(
                f"node {self.node!r} is not a node name (lowercase RFC 1123: a-z, 0-9, -, .)"
            )
        unknown = sorted(set(self.model_urls) - set(self.services))
        if unknown:
            raise ConfigError(
                f"model URL given for unknown LM(s) {', '.join(unknown)}; "
                f"services are {', '.join(sorted(self.services)) or 'none'}"
            )
        for name, lms in self.classes.items():
            missing = [lm for lm in lms if lm not in self.services]
            if not lms or missing:
                raise ConfigError(f"request class {name!r} names no known LM: {list(lms)}")
            kinds = sorted({self.services[lm] for lm in lms})
            if len(kinds) > 1:
                raise ConfigError(
                    f"request class {name!r} is served by LMs of different modalities "
                    f"({', '.join(kinds)}); a class needs one"
                )

    def models_for(self, name: str) -> list[str]:
        """The LM services that may serve requests for `name` (an LM serves itself first)."""
        own = [name] if name in self.services else []
        return [*own, *(lm for lm in self.classes.get(name, ()) if lm != name)]

    def modality(self, name: str) -> Modality | None:
        """The modality of an LM or request class; None when it is neither."""
        models = self.models_for(name)
        return self.services[models[0]] if models else None

    def names(self) -> dict[str, Modality]:
        """{LM or request class: modality}: what users may name as `model`."""
        out = {c: self.services[lms[0]] for c, lms in self.classes.items() if lms}
        out.update(self.services)
        return out

    def peer_url(self, node: str) -> str | None:
        if node in self.peers:
            return self.peers[node]
        if self.peer_url_template:
            return self.peer_url_template.format(node=node)
        return None


def request_classes(services: Sequence[ServiceInfo]) -> dict[str, list[str]]:
    """{request class: the LMs that serve it, in manifest order} from LMService `serves`.

    Only names some LM lists in `serves` appear; an LM always serves itself.
    """
    out: dict[str, list[str]] = {}
    for s in services:
        for name in s.spec.serves:
            if name != s.name:
                out.setdefault(name, []).append(s.name)
    return out


#: A Kubernetes Node name (RFC 1123 subdomain).
_NODE_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


class Gateway:
    """One node's gateway. Build it inside a running event loop (it owns tasks)."""

    def __init__(
        self,
        settings: GatewaySettings,
        *,
        peers: PeerCaller,
        models: ModelCaller,
        sink: RecordSink,
        metrics: GatewayMetrics | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        build_router: RouterBuilder | None = None,
        build_seed: SeedBuilder | None = None,
    ) -> None:
        self.settings = settings
        self.node = settings.node
        self.metrics = metrics or GatewayMetrics(settings.node)
        self.routing = RoutingTable(node=settings.node, run=settings.run)
        self.local = LocalModels(dict(settings.model_urls))
        self.queues = LMQueues(
            node=settings.node,
            models=self.local,
            caller=models,
            monotonic=monotonic,
            wall=wall,
            on_depth=self.metrics.set_depth,
        )
        self._peers = peers
        self._models = models
        self._sink = sink
        self._monotonic = monotonic
        self._wall = wall
        self._started_at = wall()
        self._client_ids: OrderedDict[str, None] = OrderedDict()
        # Resolved by `stop_waiting` at shutdown: every set still waiting then gets
        # an outcome at once instead of holding the process until its deadline.
        self._stopped: asyncio.Future[None] | None = None
        self._waiting = 0
        # Resolved by a routing push when an LM or a node leaves the cluster:
        # ("lm", name) / ("node", name) -> (outcome, why) for the sets waiting on it.
        self._ends: dict[tuple[str, str], asyncio.Future[tuple[RequestOutcome, str]]] = {}
        # Set by the first routing push. Until then a set this node cannot serve
        # itself is held here (see `submit`), counted per LM in the queue depth.
        self._routed = asyncio.Event()
        self._held: Counter[str] = Counter()
        # Request-level routing (`lmedge.dataplane.windows`), when the process can build
        # routers (the `lmedge gateway` root gives the catalog's builders).
        self.windows = (
            RequestWindows(
                settings.node,
                build_router=build_router,
                build_seed=build_seed,
                forwarding=self,
                sink=sink.put_decision,
                clock_s=lambda: self._wall() - (self.routing.run_started_at or self._started_at),
                monotonic=monotonic,
            )
            if build_router is not None and build_seed is not None
            else None
        )

    # -- control ------------------------------------------------------------------

    def set_routing(self, update: RoutingUpdate) -> int:
        """Install the slot's routing map.

        A map naming an LM or request class unknown here, or a route whose
        `model` does not serve its class, is refused whole: the gateway keeps
        the previous map rather than serve a class with the wrong model.
        """
        settings = self._live_settings(update)
        named = {r.lm for r in update.routing.routes} | {r.lm for r in update.routing.rejections}
        unknown = sorted(n for n in named if not settings.models_for(n))
        if unknown:
            raise UnknownLM(f"routing map names unknown LM(s): {', '.join(unknown)}")
        wrong = sorted(
            f"{r.lm} -> {r.model}"
            for r in update.routing.routes
            if r.model is not None and r.model not in settings.models_for(r.lm)
        )
        if wrong:
            raise UnknownLM(f"routing map routes a class to an LM that does not serve it: {wrong}")
        removed = sorted(set(self.settings.services) - set(settings.services))
        self.settings = settings
        if removed:
            kept = {lm: self.local.url(lm) for lm in self.local.active() if lm not in removed}
            self.local.replace({lm: u for lm, u in kept.items() if u})
        for lm in removed:
            self._end(("lm", lm), "lm_removed", f"LMService {lm} was deleted")
        for node in update.lost:
            self._end(("node", node), "node_lost", f"node {node} left the cluster")
        entries = self.routing.update(update, self._monotonic())
        self._routed.set()
        if self.windows is not None:
            self.windows.install(update.requests, self.routing.run, self.routing.slot)
        elif update.requests is not None:
            log.warning("routing push asks for request-level routing, which this gateway "
                        "cannot run (no router builder); the map routes")  # fmt: skip
        return entries

    # -- request-level routing (`Forwarding` for `RequestWindows`) ----------------------

    def unforwardable(self, request: WindowRequest, route: Route) -> str | None:
        """Why this gateway cannot send `request` along `route` (None: it can)."""
        if route.origin != request.origin or route.lm != request.lm:
            return f"route for ({route.origin}, {route.lm}), not ({request.origin}, {request.lm})"
        if route.destination != self.node and self.settings.peer_url(route.destination) is None:
            return f"no address for node {route.destination}"
        models = self.settings.models_for(request.lm)
        if route.model is not None and route.model not in models:
            return f"{route.model} does not serve {request.lm}"
        if route.model is None and request.lm not in self.settings.services and not models:
            return f"no LM serves {request.lm}"
        return None

    def by_map(self, request: WindowRequest) -> Route:
        """The slot's map's route for `request`: its (origin, class) entry, else local."""
        return Route(
            origin=request.origin,
            lm=request.lm,
            destination=self.routing.destination(request.lm),
            model=self.routing.model(request.lm),
        )

    async def _window_route(
        self, rid: str, lm: str, prompts: int, submit_s: float
    ) -> tuple[str, str, float]:
        """(destination, serving LM, seconds waited) of a request routed in a window."""
        assert self.windows is not None
        routed = await self.windows.route(
            WindowRequest(
                id=rid, origin=self.node, lm=lm, prompts=prompts, submit_s=max(submit_s, 0.0)
            )
        )
        route = routed.route
        return route.destination, route.model or self.settings.models_for(lm)[0], routed.waited_s

    def _live_settings(self, update: RoutingUpdate) -> GatewaySettings:
        """The settings with the pushed LMServices and classes (the same without them)."""
        if update.services is None:
            return self.settings
        services = dict(update.services)
        try:
            return replace(
                self.settings,
                services=services,
                classes=dict(update.classes or {}),
                model_urls={k: v for k, v in self.settings.model_urls.items() if k in services},
            )
        except ConfigError as exc:  # e.g. a class naming an LM not pushed: refuse the map
            raise UnknownLM(f"routing push: {exc}") from exc

    def _end(self, key: tuple[str, str], outcome: RequestOutcome, error: str) -> None:
        """End every set waiting on `key` (an LM or a node) now, with `outcome`."""
        ended = self._ends.pop(key, None)
        if ended is not None and not ended.done():
            ended.set_result((outcome, error))

    def set_models(self, message: LocalModelsMessage) -> list[str]:
        """Replace the set of model pods serving on this node; return the active LMs."""
        urls = {m.lm: m.url for m in message.models}
        unknown = sorted(set(urls) - set(self.settings.services))
        if unknown:
            raise UnknownLM(f"unknown LM(s): {', '.join(unknown)}")
        self.local.replace(
            urls,
            {m.lm: m.protocol for m in message.models},
            {m.lm: m.concurrency for m in message.models},
        )
        return self.local.active()

    def status(self) -> GatewayStatus:
        return GatewayStatus(
            node=self.node,
            run=self.routing.run,
            slot=self.routing.slot,
            routes=len(self.routing.routes()),
            active=self.local.active(),
            queue_depth=self._depth(),
            windows=dict(self.windows.stats) if self.windows and self.windows.active else None,
        )

    def _depth(self) -> dict[str, int]:
        """Sets waiting per LM: in the queues (not the one running), and held for a map."""
        depth = self.queues.depth()
        for lm, n in self._held.items():
            depth[lm] = depth.get(lm, 0) + n
        return depth

    # -- origin ---------------------------------------------------------------------

    def check_lm(self, lm: str) -> Modality:
        """The modality of an LM or request class; `UnknownLM` (one line) when it is neither."""
        modality = self.settings.modality(lm)
        if modality is None:
            known = ", ".join(sorted(self.settings.names())) or "none"
            raise UnknownLM(f"unknown LM {lm!r}; this cluster serves: {known}")
        return modality

    def serving_model(self, lm: str) -> str:
        """The LM that serves this node's requests for `lm` (an LM or a request class).

        The routing map's `Route.model` for (this node, `lm`) when it names
        one (checked on install), else `lm` itself when it is an LM, else the
        class's first LM in manifest order.
        """
        return self.routing.model(lm) or self.settings.models_for(lm)[0]

    def _claim(self, request_id: str) -> None:
        """Remember a client-chosen id; `DuplicateRequestId` if it was used before."""
        if request_id in self._client_ids:
            raise DuplicateRequestId(
                f"request id {request_id!r} was already used at {self.node}; "
                "give every prompt set its own id (or none: the gateway then chooses one)"
            )
        self._client_ids[request_id] = None
        if len(self._client_ids) > REMEMBERED_IDS:
            self._client_ids.popitem(last=False)

    def choose(self, lm: str) -> str:
        """The destination node of a set for `lm` submitted here (timed)."""
        start = time.perf_counter()
        destination = self.routing.destination(lm)
        self.metrics.decision.observe(time.perf_counter() - start)
        return destination

    async def submit(
        self, lm: str, prompts: list[Prompt], request_id: str | None = None
    ) -> PromptSetResult:
        """Serve a prompt set submitted at this node, along the routing map.

        Raises `Rejected` (after recording the set) when the map refuses it.
        """
        self.check_lm(lm)
        if request_id is not None:
            self._claim(request_id)
        rid = request_id or uuid.uuid4().hex
        start = self._monotonic()
        submitted_at = self._wall()
        model = self.serving_model(lm)
        held, end = await self._hold(lm, model, start)
        if end is None and self.settings.modality(lm) is None:  # the first map removed it
            end = ("lm_removed", f"LMService {lm} was deleted")
        slot, run = self.routing.slot, self.routing.run
        anchor = self.routing.run_started_at or self._started_at
        if end is None and self.routing.rejects(lm):
            self._refuse(rid, lm, len(prompts), slot, run, anchor)
        destination = self.node if end else self.choose(lm)
        model = model if end else self.serving_model(lm)
        waited = 0.0  # in a routing window: counted in the uplink, as in the emulator
        if end is None and self.windows is not None and self.windows.active:
            destination, model, waited = await self._window_route(
                rid, lm, len(prompts), submitted_at - anchor
            )
        tau = self._tau()
        left = tau - (self._monotonic() - start)
        sent_at = self._wall()
        # The destination serves the model; the record keeps the class the user named.
        forward = ForwardRequest(id=rid, lm=model, origin=self.node, prompts=prompts,
                                 sent_at=sent_at, budget_s=max(left, 1e-6))  # fmt: skip
        if end is not None:  # the gateway stopped, or the LM or this node left, while held
            result = self._lost(forward, self.node, *end)
        elif left <= 0:  # held to its deadline: no map came and no pod of the LM here
            result = self._unserved(forward)
        else:
            result = await self._unless_stopped(
                self._dispatch(destination, forward),
                lambda: self._undelivered(forward, destination, SHUTTING_DOWN),
                ends=(("lm", model), ("node", destination)),
                ended=lambda outcome, why: self._lost(forward, destination, outcome, why),
            )
        if held:
            # Held here waiting for the LM: queueing, and a conflict as at a destination.
            result = result.model_copy(update={"queue_s": result.queue_s + held, "conflict": True})
        rtt = self._monotonic() - start
        if result.outcome == "success" and rtt > tau:
            # The destination met the deadline but the result came back too late.
            result = result.model_copy(update={"outcome": "timeout"})
        times = split_stages(
            total_s=record_total(rtt_s=rtt, outcome=result.outcome, error=result.error, tau_s=tau),
            sent_at=sent_at - waited,
            received_at=result.received_at,
            queue_s=result.queue_s,
            inference_s=result.inference_s,
        )
        record = build_record(
            request_id=rid,
            run=run,
            lm=lm,
            origin=self.node,
            prompts=len(prompts),
            slot=slot,
            submit_s=submitted_at - anchor,
            times=times,
            result=result,
            model=None if model == lm else model,
        )
        self._finish(record)
        return PromptSetResult(
            id=rid,
            lm=lm,
            model=record.model,
            origin=self.node,
            destination=result.destination,
            outcome=result.outcome,
            conflict=result.conflict,
            prompts=len(prompts),
            prompts_done=record.prompts_done,
            outputs=result.outputs,
            times=times,
            error=result.error,
        )

    def _tau(self) -> float:
        return self.routing.tau_s or self.settings.tau_s  # the run's, once pushed

    async def _hold(
        self, lm: str, model: str, start: float
    ) -> tuple[float, tuple[RequestOutcome, str] | None]:
        """Hold a set that arrived before this gateway's first routing map and that it
        cannot serve itself (no local pod of `model`); the seconds held, and why
        the hold ended early (the gateway stopped, the LM or this node left), if it did.

        A fresh gateway (a new node, a restarted pod) knows no route: served
        locally, such a set would wait for a pod the deployer may never start
        here, to its deadline, even once the map routes the LM elsewhere. Held,
        it follows the first map (a slot at most), or is served here as soon as
        a pod of its LM registers, or misses its deadline here.
        """
        if self._routed.is_set() or self.local.url(model) is not None:
            return 0.0, None
        self._held[lm] += 1
        try:
            end: tuple[RequestOutcome, str] | None = await self._unless_stopped(
                self._await_route(lm, start),
                lambda: ("timeout", SHUTTING_DOWN),
                ends=(("lm", model), ("node", self.node)),
                ended=lambda outcome, why: (outcome, why),
            )
        finally:
            self._held[lm] -= 1
            if not self._held[lm]:
                del self._held[lm]
        return self._monotonic() - start, end

    async def _await_route(self, lm: str, start: float) -> None:
        """Return at the first routing map, a local pod for `lm`, or the deadline."""
        while not self._routed.is_set() and self.local.url(self.serving_model(lm)) is None:
            left = self._tau() - (self._monotonic() - start)
            if left <= 0:
                return
            waits = [asyncio.ensure_future(self._routed.wait()),
                     asyncio.ensure_future(self.local.wait_changed(left))]  # fmt: skip
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waits:
                    w.cancel()

    def _unserved(self, forward: ForwardRequest) -> ForwardResult:
        """A set held here to its deadline: missed, as one that waited in the local queue."""
        return _unanswered(forward, self.node, conflict=True)

    async def _dispatch(self, destination: str, forward: ForwardRequest) -> ForwardResult:
        if destination == self.node:
            return await self.accept(forward)
        url = self.settings.peer_url(destination)
        if url is None:
            return self._undelivered(forward, destination, f"no address for node {destination!r}")
        try:
            return await self._peers.forward(url, forward, forward.budget_s + self.settings.grace_s)
        except TransientError as exc:
            return self._undelivered(forward, destination, str(exc))

    def _undelivered(self, forward: ForwardRequest, destination: str, error: str) -> ForwardResult:
        log.warning(
            "set %s for %s not delivered to %s: %s", forward.id, forward.lm, destination, error
        )
        return _unanswered(forward, destination, error=error)

    def _lost(
        self, forward: ForwardRequest, destination: str, outcome: RequestOutcome, why: str
    ) -> ForwardResult:
        """The answer for a set ended because its LM or node left the cluster."""
        log.warning("set %s for %s at %s ended: %s", forward.id, forward.lm, destination, why)
        return self._undelivered(forward, destination, why).model_copy(update={"outcome": outcome})

    def _refuse(
        self, rid: str, lm: str, prompts: int, slot: int, run: str, anchor: float
    ) -> NoReturn:
        """Record a set admission control refuses, then raise `Rejected`."""
        retry = self.routing.retry_after_s(self._monotonic())
        # Stage times stay 0: the set went nowhere, and the refusal itself is a
        # dict lookup (microseconds), as in the emulator.
        record = RequestRecord(
            id=rid,
            run=run,
            lm=lm,
            origin=self.node,
            destination=self.node,
            prompts=prompts,
            slot=slot,
            submit_s=max(self._wall() - anchor, 0.0),
            outcome="rejected",
            mode="none",
        )
        self._finish(record)
        raise Rejected(
            f"request {rid} for {lm} refused by admission control at {self.node}: the"
            f" cluster cannot serve it within its deadline now; retry in {retry} s",
            request_id=rid,
            retry_after_s=retry,
        )

    def _finish(self, record: RequestRecord) -> None:
        self.metrics.observe(record)
        self._sink.put(record)

    # -- destination ----------------------------------------------------------------

    async def accept(self, forward: ForwardRequest) -> ForwardResult:
        """Serve a set forwarded here (or submitted here and routed locally)."""
        if forward.lm not in self.settings.services:  # origins forward LMs, never classes
            self.check_lm(forward.lm)
            raise UnknownLM(f"{forward.lm!r} is a request class, not an LM this node can queue")
        return await self._unless_stopped(
            self.queues.submit(forward),
            lambda: self._undelivered(forward, self.node, SHUTTING_DOWN),
            ends=(("lm", forward.lm), ("node", self.node)),
            ended=lambda outcome, why: self._lost(forward, self.node, outcome, why),
        )

    # -- streams ------------------------------------------------------------------

    async def open_stream(
        self, lm: str, prompt: Prompt, messages: list[dict[str, Any]] | None = None
    ) -> OpenedStream:
        """Admit and route one streamed prompt submitted here; its events come later.

        Raises `UnknownLM`, or `Rejected` (after recording it) when the map refuses it.
        Under request-level routing it returns once its window is routed.
        """
        self.check_lm(lm)
        rid = uuid.uuid4().hex
        start = self._monotonic()
        anchor = self.routing.run_started_at or self._started_at
        submit_s = self._wall() - anchor
        slot, run = self.routing.slot, self.routing.run
        if self.routing.rejects(lm):
            self._refuse(rid, lm, 1, slot, run, anchor)
        destination = self.choose(lm)
        model = self.serving_model(lm)
        waited = 0.0
        if self.windows is not None and self.windows.active:
            destination, model, waited = await self._window_route(rid, lm, 1, submit_s)
        tau = self._tau()
        forward = StreamForward(id=rid, lm=model, origin=self.node, prompt=prompt,
                                messages=messages, sent_at=self._wall(), budget_s=tau)  # fmt: skip

        def record(clock: StreamClock, end: StreamEnd, estimated: bool) -> None:
            self._finish(
                stream_record(
                    request_id=rid,
                    run=run,
                    lm=lm,
                    origin=self.node,
                    slot=slot,
                    submit_s=submit_s,
                    sent_at=forward.sent_at - waited,
                    tau_s=tau,
                    clock=clock,
                    end=end,
                    estimated=estimated,
                    model=None if model == lm else model,
                )
            )

        events = self._origin_events(destination, forward, start, record)
        return OpenedStream(id=rid, model=model, destination=destination, events=events)

    async def _origin_events(
        self,
        destination: str,
        forward: StreamForward,
        start: float,
        record: Callable[[StreamClock, StreamEnd, bool], None],
    ) -> AsyncGenerator[StreamText | StreamEnd, None]:
        """The destination's pieces and end, passed on as they arrive; the record at the end."""
        first: float | None = None
        last: float | None = None
        pieces = 0
        began: StreamStart | None = None

        def clock() -> StreamClock:
            return StreamClock(self._monotonic() - start, first, last, pieces)

        def made_up(outcome: RequestOutcome, error: str) -> StreamEnd:
            return StreamEnd(
                destination=destination,
                outcome=outcome,
                error=error,
                received_at=began.received_at if began else forward.sent_at,
                queue_s=began.queue_s if began else 0.0,
                conflict=began.conflict if began else False,
            )

        end: StreamEnd | None = None
        try:
            async with contextlib.aclosing(self._upstream(destination, forward)) as upstream:
                async for event in upstream:
                    if isinstance(event, StreamStart):
                        began = event
                    elif isinstance(event, StreamText):
                        now = self._monotonic() - start
                        first = now if first is None else first
                        last = now
                        pieces += 1
                        yield event
                    else:
                        end = event
                        break
        except TransientError as exc:  # the peer broke off or could not be reached
            end = made_up("failed", str(exc))
            record(clock(), end, True)
        except (asyncio.CancelledError, GeneratorExit):
            record(clock(), made_up("cancelled", "the client closed the stream"), True)
            raise
        except Exception as exc:  # a bug must not lose the record or hang the client
            log.exception("stream %s for %s failed in the gateway", forward.id, forward.lm)
            end = made_up("failed", f"gateway error: {type(exc).__name__}: {exc}")
            record(clock(), end, True)
        else:
            end = end or made_up("failed", f"the stream from {destination} ended without its end")
            record(clock(), end, False)
        yield end

    def _upstream(
        self, destination: str, forward: StreamForward
    ) -> AsyncGenerator[StreamStart | StreamText | StreamEnd, None]:
        if destination == self.node:
            return self.accept_stream(forward)
        url = self.settings.peer_url(destination)
        if url is None:
            return _one(self._stream_undelivered(forward, destination, "no address"))
        return self._peers.forward_stream(url, forward, forward.budget_s + self.settings.grace_s)

    def _stream_undelivered(self, forward: StreamForward, destination: str, why: str) -> StreamEnd:
        return StreamEnd(destination=destination, outcome="failed", error=why,
                         received_at=forward.sent_at, queue_s=0.0)  # fmt: skip

    def check_stream(self, forward: StreamForward) -> None:
        """Refuse (`UnknownLM`) a stream for an LM this node does not serve, before any byte."""
        if forward.lm not in self.settings.services:
            self.check_lm(forward.lm)
            raise UnknownLM(f"{forward.lm!r} is a request class, not an LM this node can queue")

    async def accept_stream(
        self, forward: StreamForward
    ) -> AsyncGenerator[StreamStart | StreamText | StreamEnd, None]:
        """Serve a stream forwarded here (or submitted here and routed locally).

        Waits its turn in the LM's queue, then streams from the pod; ends with a
        `StreamEnd` saying how it went. Closing it early (the origin or the
        client left) closes the pod's stream and frees the pod.
        """
        self.check_stream(forward)
        arrived = self._monotonic()
        received_at = self._wall()
        lease = await self.queues.lease(forward)
        if lease is None:
            yield StreamEnd(destination=self.node, outcome="timeout", received_at=received_at,
                            queue_s=self._monotonic() - arrived)  # fmt: skip
            return
        deadline = arrived + forward.budget_s
        taken = self._monotonic()
        first: float | None = None
        pieces = 0
        finish = Finish()
        outcome: RequestOutcome = "success"
        error: str | None = None
        invalid = False
        try:
            yield StreamStart(destination=self.node, received_at=lease.received_at,
                              queue_s=lease.queue_s, conflict=lease.conflict)  # fmt: skip
            call = EngineCall(id=forward.id, lm=forward.lm, prompt=forward.prompt,
                              messages=forward.messages,
                              budget_s=max(deadline - self._monotonic(), 1e-6))  # fmt: skip
            async with contextlib.aclosing(self._pod_stream(lease, call, deadline)) as pod:
                async for item in pod:
                    if isinstance(item, Finish):
                        finish = item
                        continue
                    first = self._monotonic() if first is None else first
                    pieces += 1
                    yield StreamText(text=item.text)
                    if self._monotonic() > deadline:
                        outcome, error = "timeout", None
                        break
        except BadRequest as exc:
            outcome, error, invalid = "failed", str(exc), True
        except ModelFailed as exc:
            outcome, error = "failed", f"model server for {forward.lm} failed: {exc}"
        except ModelUnavailable as exc:
            outcome, error = "failed", f"model server for {forward.lm} unavailable: {exc}"
        finally:
            lease.release()
        now = self._monotonic()
        yield StreamEnd(
            destination=self.node,
            outcome=outcome,
            error=error,
            invalid=invalid,
            received_at=lease.received_at,
            queue_s=lease.queue_s,
            prefill_s=(first if first is not None else now) - taken,
            decode_s=now - first if first is not None else 0.0,
            conflict=lease.conflict,
            mode=finish.mode or ("none" if first is None else ENGINE_MODE),
            prompt_tokens=finish.prompt_tokens,
            completion_tokens=(
                finish.completion_tokens if finish.completion_tokens is not None else pieces
            ),
            finish_reason=finish.finish_reason,
        )

    async def _pod_stream(
        self, lease: PodLease, call: EngineCall, deadline: float
    ) -> AsyncGenerator[Piece | Finish, None]:
        """The pod's stream; a pod not ready yet is retried until the deadline (cold start)."""
        protocol = pod_protocol(lease.protocol)
        while True:
            left = deadline - self._monotonic()
            stream = self._models.stream_pod(lease.url, protocol, call, left + self.queues.grace_s)
            try:
                async with contextlib.aclosing(stream):
                    async for item in stream:
                        yield item
                return
            except ModelUnavailable:
                # Raised before the first byte only: nothing was passed on yet.
                if deadline - self._monotonic() <= self.queues.retry_interval_s:
                    raise
                await asyncio.sleep(self.queues.retry_interval_s)

    # -- shutdown -------------------------------------------------------------------

    def stop_waiting(self) -> int:
        """Answer every set still waiting here now, as timed out; return how many.

        Called when the drain period after SIGTERM is over: an origin records
        its sets (outcome `timeout`, error "gateway shutting down") and answers
        its users; a destination answers its origins, which record them.
        """
        if self._stopped is None:
            self._stopped = asyncio.get_running_loop().create_future()
        if not self._stopped.done():
            self._stopped.set_result(None)
        return self._waiting

    async def _unless_stopped(
        self,
        work: Coroutine[Any, Any, T],
        stopped: Callable[[], T],
        *,
        ends: tuple[tuple[str, str], ...] = (),
        ended: Callable[[RequestOutcome, str], T] | None = None,
    ) -> T:
        """`work`'s result, unless the gateway stops first (`stopped()`) or one of
        `ends` (an LM or node) leaves the cluster first (`ended(outcome, why)`)."""
        loop = asyncio.get_running_loop()
        if self._stopped is None:
            self._stopped = loop.create_future()
        if self._stopped.done():
            work.close()
            return stopped()
        watched = [self._ends.setdefault(key, loop.create_future()) for key in ends]
        task = asyncio.ensure_future(work)
        self._waiting += 1
        try:
            waits: list[asyncio.Future[Any]] = [task, self._stopped, *watched]
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            task.cancel()
            raise
        finally:
            self._waiting -= 1
        if task.done():
            return task.result()
        task.cancel()
        gone = next((f for f in watched if f.done()), None)
        if gone is not None and ended is not None and not self._stopped.done():
            return ended(*gone.result())
        return stopped()

    async def close(self) -> None:
        if self.windows is not None:
            await self.windows.close()
        await self.queues.close()
        # A store sink joins its writer thread and flushes: keep the loop free.
        await asyncio.to_thread(self._sink.close)


def _unanswered(
    forward: ForwardRequest, destination: str, *, conflict: bool = False, error: str | None = None
) -> ForwardResult:
    """A missed set's result: no output, no time at the destination."""
    return ForwardResult(
        id=forward.id,
        destination=destination,
        received_at=forward.sent_at,
        queue_s=0.0,
        inference_s=0.0,
        outcome="timeout",
        conflict=conflict,
        mode="none",
        outputs=[],
        error=error,
    )


async def _one(end: StreamEnd) -> AsyncGenerator[StreamStart | StreamText | StreamEnd, None]:
    yield end
