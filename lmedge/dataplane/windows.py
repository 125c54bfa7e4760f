"""Request-level routing at the origin gateway: its requests in windows, routed by the run's router.

When the routing push carries `RequestRouting` (the run's router declares
`Capabilities.routes_requests`, e.g. `cema-request`), the gateway does not
look a request up in the slot's map: it adds it to the open window, which
closes `window_s` after its first request or at `window_requests`; then the
run's router (built here from the pushed policy through the plugin catalog,
the same code the emulator calls: `RequestRouter.route_requests`) routes the
window on a worker thread, with the pushed context and snapshot and its own
dispatch record, and each request goes to its route.

The added delay is bounded: the router has `budget_s` after the close, less
a share kept for the seed (`seed_s`); when it has not answered by then,
raises, answers the wrong number of routes or a route the gateway cannot
forward, the window goes by the router's fallback (its declared
`Capabilities.fallback_router`, e.g. `ll-kv` for LYREO's; else CEMA's
load-aware seed `SEED_ROUTER`, one pass over the catalogue), on its own
thread, and failing that by the slot's map,
request by request. No request is dropped: every one gets a route by
`close + budget_s`, i.e. at most `window_s + budget_s` after it arrived, and
that wait counts in its uplink, as in the emulator.

Router state. Each gateway keeps its own copy of the router, used by its
thread only, so a router's state across windows (CEMA's dispatch record
B_d; a LYREO router's per-server virtual queues) is this origin's view: it
grows by what this gateway sends and is re-anchored each slot by the pushed
snapshot (deployed pairs, queue depths, engine telemetry) that every window
carries. A new context or policy builds a new copy (its state starts
empty). A window that fell back to the seed is not in the router's record.
What the gateways do not share is the joint term across origins: each
window holds one origin's requests (a central picker would see them all, at
a round trip per window).

Every window is audited: one `Decision[RoutingMap]` (agent `scheduler`,
`node` this gateway, `window` the routes (one per request) and the terms the
router reported, who routed it, and in `error` why it fell back), handed to
the gateway's record sink, which stores it through the same write buffer as
its request records. This module does not forward: the gateway does.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeVar, runtime_checkable

from lmedge.api import (
    ClusterContext,
    Decision,
    RequestRouter,
    RequestWindow,
    Route,
    RoutingMap,
    WindowRequest,
)
from lmedge.api.decisions import WINDOW_TRIGGER, RoutedRequest, WindowAudit
from lmedge.api.gateway_control import RequestRouting
from lmedge.api.runconfig import PolicyConfig

__all__ = [
    "Forwarding",
    "RequestWindows",
    "RouterBuilder",
    "SeedBuilder",
    "WindowRoute",
    "seed_share_s",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Builds the run's request router for a node (`controller.assembly.build_gateway_router`).
RouterBuilder = Callable[[PolicyConfig, ClusterContext, str], RequestRouter]
#: Builds the run's fallback router for a node (`controller.assembly.build_seed_router`).
SeedBuilder = Callable[[PolicyConfig, ClusterContext, str], RequestRouter]

#: The seed's share of a window's budget, at most `SEED_MAX_S`: the seed is one
#: pass over the catalogue (milliseconds), so a quarter second is ample and the
#: router keeps the rest.
SEED_SHARE = 0.25
SEED_MAX_S = 0.25

Used = Literal["router", "seed", "map"]


def seed_share_s(budget_s: float) -> float:
    """Seconds of a window's budget kept for the seed (the router has the rest)."""
    return min(SEED_MAX_S, budget_s * SEED_SHARE)


@dataclass(frozen=True)
class WindowRoute:
    """Where one request goes, who chose it, and how long it waited for its window."""

    route: Route
    used: Used
    waited_s: float


class Forwarding(Protocol):
    """What the gateway answers about routes (it alone knows its peers and LMs)."""

    def unforwardable(self, request: WindowRequest, route: Route) -> str | None:
        """Why the gateway cannot forward `request` along `route` (None: it can)."""
        ...

    def by_map(self, request: WindowRequest) -> Route:
        """The slot's map's route for `request` (always forwardable)."""
        ...


@runtime_checkable
class WindowReport(Protocol):
    """A router's report of its last window (CEMA's `requests.Outcome`)."""

    j: float
    seed_j: float
    quality_loss: float
    cost: float
    energy: float
    makespan: float


@runtime_checkable
class ReportsWindows(Protocol):
    """A request router that keeps its last window's report (`CemaRouter.last_window`)."""

    last_window: Any


@dataclass
class _Pending:
    request: WindowRequest
    arrived: float  # monotonic
    done: asyncio.Future[WindowRoute]


@dataclass
class _Window:
    routing: RequestRouting
    key: str
    run: str
    slot: int
    start_s: float
    members: list[_Pending] = field(default_factory=list)
    full: asyncio.Event = field(default_factory=asyncio.Event)


class _Unroutable(Exception):
    """A router's answer the gateway cannot follow (wrong count, a route it cannot forward)."""


class RequestWindows:
    """One gateway's routing windows. Build it inside a running event loop.

    `sink` takes each window's audit `Decision`; `clock_s` is the run clock
    (seconds since the run started) that windows and requests are stamped with.
    """

    def __init__(
        self,
        node: str,
        *,
        build_router: RouterBuilder,
        build_seed: SeedBuilder,
        forwarding: Forwarding,
        sink: Callable[[Decision[RoutingMap]], None],
        clock_s: Callable[[], float],
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.node = node
        self._build_router = build_router
        self._build_seed = build_seed
        self._forwarding = forwarding
        self._sink = sink
        self._clock_s = clock_s
        self._monotonic = monotonic
        self._routing: RequestRouting | None = None
        self._key = ""
        self._run = ""
        self._slot = 0
        self._open: _Window | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        # One thread each: a router's state is touched by its thread only, and a
        # late router never delays the seed.
        self._router_pool = ThreadPoolExecutor(1, thread_name_prefix=f"window-router-{node}")
        self._seed_pool = ThreadPoolExecutor(1, thread_name_prefix=f"window-seed-{node}")
        # (key, router) as built by each thread; read and written by that thread only
        self._router: tuple[str, RequestRouter] | None = None
        self._seed: tuple[str, RequestRouter] | None = None
        #: Windows decided, and of those how many went by the seed and by the map.
        self.stats = {"windows": 0, "requests": 0, "router": 0, "seed": 0, "map": 0}

    @property
    def active(self) -> bool:
        """Whether requests are routed in windows now (the last push said so)."""
        return self._routing is not None

    def install(self, routing: RequestRouting | None, run: str, slot: int) -> None:
        """Follow a routing push: route in windows with `routing` from now on (None: stop).

        A new policy or context builds the routers again, on their threads,
        and warms them (a first call compiles CEMA's kernel) before the next
        window needs them. A window already open keeps the push it opened under.
        """
        self._routing, self._run, self._slot = routing, run, slot
        if routing is None:
            return
        key = _key(routing)
        if key != self._key:
            self._key = key
            self._router_pool.submit(self._warm, key, routing, False)
            self._seed_pool.submit(self._warm, key, routing, True)

    async def route(self, request: WindowRequest) -> WindowRoute:
        """The route of one request, once its window is decided (bounded, never raises)."""
        routing = self._routing
        if routing is None:
            return WindowRoute(self._forwarding.by_map(request), "map", 0.0)
        window = self._open
        if window is None or window.key != self._key:
            window = _Window(routing, self._key, self._run, self._slot, request.submit_s)
            self._open = window
            task = asyncio.ensure_future(self._close_and_decide(window))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        done: asyncio.Future[WindowRoute] = asyncio.get_running_loop().create_future()
        window.members.append(_Pending(request, self._monotonic(), done))
        if len(window.members) >= routing.window_requests:
            self._open = None
            window.full.set()
        return await asyncio.shield(done)

    async def close(self) -> None:
        """Decide the windows still open (bounded by their budget), then stop the threads."""
        if self._open is not None:
            self._open.full.set()
            self._open = None
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        self._router_pool.shutdown(wait=False, cancel_futures=True)
        self._seed_pool.shutdown(wait=False, cancel_futures=True)

    # -- deciding a window ------------------------------------------------------

    async def _close_and_decide(self, window: _Window) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(window.full.wait(), window.routing.window_s)
        if self._open is window:
            self._open = None
        try:
            self._decide(window, *(await self._routes(window)))
        except Exception as exc:  # a bug here must not lose the window's requests
            log.exception("window at %s: deciding failed; the map routes it", self.node)
            self._decide(window, None, "map", f"gateway error: {exc}", None, 0.0)

    async def _routes(
        self, window: _Window
    ) -> tuple[list[Route] | None, Used, str | None, WindowReport | None, float]:
        """(routes, who routed, why not the router, the router's report, seconds spent)."""
        routing = window.routing
        closed = self._monotonic()
        deadline = closed + routing.budget_s
        requests = [p.request for p in window.members]
        end_s = max(self._clock_s(), window.start_s)
        rw = RequestWindow(
            slot=window.slot,
            start_s=window.start_s,
            end_s=end_s,
            context=routing.context,
            snapshot=routing.snapshot,
            requests=requests,
        )
        why: str | None
        router_s = deadline - seed_share_s(routing.budget_s) - closed
        try:
            routes, report = await self._within(
                self._router_pool, router_s, self._call, window.key, routing, rw, False
            )
            self._check(requests, routes)
            return routes, "router", None, report, self._monotonic() - closed
        except TimeoutError:
            why = f"the router did not answer within {router_s:.3g} s"
        except _Unroutable as exc:
            why = f"the router's answer cannot be followed: {exc}"
        except Exception as exc:
            why = f"the router failed: {type(exc).__name__}: {exc}"
        try:
            left = deadline - self._monotonic()
            routes, _ = await self._within(
                self._seed_pool, left, self._call, window.key, routing, rw, True
            )
            self._check(requests, routes)
            return routes, "seed", why, None, self._monotonic() - closed
        except TimeoutError:
            why += "; the seed did not answer in time"
        except _Unroutable as exc:
            why += f"; the seed's answer cannot be followed: {exc}"
        except Exception as exc:
            why += f"; the seed failed: {type(exc).__name__}: {exc}"
        return None, "map", why, None, self._monotonic() - closed

    async def _within(
        self, pool: ThreadPoolExecutor, seconds: float, fn: Callable[..., T], *args: Any
    ) -> T:
        if seconds <= 0:
            raise TimeoutError
        future = asyncio.get_running_loop().run_in_executor(pool, fn, *args)
        return await asyncio.wait_for(future, seconds)

    def _check(self, requests: Sequence[WindowRequest], routes: Sequence[Route]) -> None:
        if len(routes) != len(requests):
            raise _Unroutable(f"{len(routes)} routes for {len(requests)} requests")
        for request, route in zip(requests, routes, strict=True):
            why = self._forwarding.unforwardable(request, route)
            if why is not None:
                raise _Unroutable(f"request {request.id}: {why}")

    def _decide(
        self,
        window: _Window,
        routes: list[Route] | None,
        used: Used,
        why: str | None,
        report: WindowReport | None,
        spent_s: float,
    ) -> None:
        members = window.members
        chosen = routes or [self._forwarding.by_map(p.request) for p in members]
        now = self._monotonic()
        for pending, route in zip(members, chosen, strict=True):
            if not pending.done.done():
                pending.done.set_result(WindowRoute(route, used, now - pending.arrived))
        self.stats["windows"] += 1
        self.stats["requests"] += len(members)
        self.stats[used] += 1
        if used != "router":
            log.warning("window of %d at %s went by the %s: %s", len(members), self.node, used, why)
        self._audit(window, chosen, used, why, report, spent_s)

    def _audit(
        self,
        window: _Window,
        routes: Sequence[Route],
        used: Used,
        why: str | None,
        report: WindowReport | None,
        spent_s: float,
    ) -> None:
        policy = window.routing.policy
        end_s = max(self._clock_s(), window.start_s)
        terms: dict[str, float | None] = dict.fromkeys(
            ("j", "seed_j", "quality_loss", "cost", "energy", "makespan")
        )
        if report is not None:
            terms = {k: float(getattr(report, k)) for k in terms}
        decision = Decision[RoutingMap](
            agent="scheduler",
            policy=policy.router or policy.profile,
            source="rule" if used == "router" else "fallback",
            value=RoutingMap(routes=[]),
            run=window.run,
            slot=window.slot,
            node=self.node,
            outcome="accepted" if used == "router" else "replaced",
            error=why,
            latency_s=max(spent_s, 0.0),
            sim_time_s=end_s,
            trigger=WINDOW_TRIGGER,
            window=WindowAudit(
                start_s=window.start_s,
                end_s=end_s,
                requests=len(window.members),
                used=used,
                wait_s=max(spent_s, 0.0),
                routes=[
                    RoutedRequest(request=p.request.id, destination=r.destination, model=r.model)
                    for p, r in zip(window.members, routes, strict=True)
                ],
                **terms,
            ),
        )
        try:
            self._sink(decision)
        except Exception:  # the audit must never fail a request
            log.exception("window at %s: audit not handed to the store", self.node)

    # -- on the routers' threads -----------------------------------------------------

    def _routers(self, key: str, routing: RequestRouting, seed: bool) -> RequestRouter:
        """The router (or the seed) for `key`, built on first use in this thread."""
        held = self._seed if seed else self._router
        if held is not None and held[0] == key:
            return held[1]
        router = (
            self._build_seed(routing.policy, routing.context, self.node)
            if seed
            else self._build_router(routing.policy, routing.context, self.node)
        )
        if seed:
            self._seed = (key, router)
        else:
            self._router = (key, router)
        return router

    def _call(
        self, key: str, routing: RequestRouting, window: RequestWindow, seed: bool
    ) -> tuple[list[Route], WindowReport | None]:
        router = self._routers(key, routing, seed)
        before = router.last_window if isinstance(router, ReportsWindows) else None
        routes = router.route_requests(window)
        after = router.last_window if isinstance(router, ReportsWindows) else None
        report = after if after is not before and isinstance(after, WindowReport) else None
        return routes, report

    def _warm(self, key: str, routing: RequestRouting, seed: bool) -> None:
        """Build the router for `key` and run a throwaway copy on a one-request window.

        The copy, not the router: the router's dispatch record must hold only
        what this gateway sent.
        """
        try:
            self._routers(key, routing, seed)
            ctx = routing.context
            lm = next((c for c in ctx.request_classes if ctx.default_model(c)), None)
            if lm is None:
                return
            spare = (
                self._build_seed(routing.policy, ctx, self.node)
                if seed
                else self._build_router(routing.policy, ctx, self.node)
            )
            request = WindowRequest(id="warm-up", origin=self.node, lm=lm, prompts=1, submit_s=0)
            spare.route_requests(
                RequestWindow(
                    slot=0,
                    start_s=0,
                    end_s=0,
                    context=ctx,
                    snapshot=routing.snapshot,
                    requests=[request],
                )
            )
        except Exception:  # the windows fall back; say why once here
            log.exception("%s at %s could not be built or warmed", _what(seed), self.node)


def _what(seed: bool) -> str:
    return "the seed router" if seed else "the request router"


def _key(routing: RequestRouting) -> str:
    """What decides which router is built: the policy and the context."""
    text = routing.policy.model_dump_json() + routing.context.model_dump_json()
    return hashlib.sha256(text.encode()).hexdigest()
