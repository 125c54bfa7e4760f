"""Per-request routing over token-engine servers: a routing window as such a router sees it.

LYREO's scheduler and its baselines send each request to a server (not each
(origin, LM) pair). They are request-level routers (`Capabilities.routes_requests`,
windows set by `WindowParams`): `route_window` walks a `RequestWindow`'s
requests in order, asks the router's `choose` for a server among those that
can host the request's LM, commits the request there (so the next choice
sees it), and returns one `Route` per request. `slot_map` is the same walk
over a slot's arrivals with one choice per (origin, LM) pair: the slot's
`RoutingMap`, which applies where no window is routed (a backend that cannot
call the router per window, a window whose call failed).

`RequestSlot` holds, per feasible server of one LM, what the snapshot says
(running and waiting sequences, KV-pool usage of the LM's engine) and what
the LM's manifest says for that hardware (prefill rate, decode curve, batch
slots, KV pool), and estimates for one more request with `input` prompt
tokens and the nominal output (215 tokens: the output is not known before it
ends):

- `latency_s`: continuous batching, n = active requests with it:
  input / prefill + out * b / decode(b), b = min(n, slots), plus, when the
  batch is full, a queue of max(0, n - slots) requests, each ahead of it
  costing the server out / decode(slots) + in / prefill (a full server
  finishes a request that often, every admission's prefill stalling the
  batch: `lmedge.api.engines.saturated_seconds_per_request`), plus a cold
  start when the LM is not running there.
- `static_latency_s`: static batching with single-slot completion (the
  model LYREO argues against): only this window's batch on the server,
  sum(input) / prefill + out * k / decode(k), k its size; carried-over
  requests are ignored.
- `kv_work`: the request's normalized KV memory-time, kv bytes x (input +
  out / 2) tokens held on average x `latency_s` / (M_s x slot), M_s the
  server's GPU memory (`lmedge.metrics`' W_s).
- `count_work`: 1 / batch slots (LYREO-Count's workload).

Loads in the window's snapshot: `kv_load` = KV-pool usage x pool bytes / M_s (the
memory-time the server holds over one slot at its current occupancy),
`count_load` = active / batch slots. Pure: no randomness, no clock.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from pydantic import Field

from lmedge.api import (
    Arrival,
    ClusterContext,
    Decision,
    RequestWindow,
    Route,
    RoutingMap,
    SlotObservation,
    WindowRequest,
)
from lmedge.api.constants import COLD_START_S
from lmedge.api.engines import (
    GIB,
    NOMINAL_INPUT_TOKENS,
    NOMINAL_OUTPUT_TOKENS,
    ThroughputProfile,
    concurrent_requests,
    kv_capacity_tokens,
    saturated_seconds_per_request,
    throughput_profile,
)
from lmedge.policies.kit.params import PluginParams

__all__ = ["RequestSlot", "Server", "WindowParams", "route_window", "slot_map"]


class WindowParams(PluginParams):
    """The routing window of a per-request router (`Capabilities.window_s`, `window_requests`).

    The defaults route a 1-s slot's requests in one call (LYREO's setting:
    its scheduler decides each slot's requests together, and its virtual
    queues move once a slot).
    """

    window_s: float = Field(default=1.0, gt=0, description="The routing window, seconds.")
    window_requests: int = Field(
        default=1024, ge=1, description="Most requests a call (a larger window is split)."
    )


@dataclass
class Server:
    """One feasible server of one LM in a slot; `active`, `batch_*` and the loads move
    as requests are committed to it."""

    name: str
    profile: ThroughputProfile
    slots: int
    kv_bytes: int
    capacity_bytes: float
    pool_bytes: float
    ready: bool
    active: int
    kv_load: float
    count_load: float
    batch_requests: int = 0
    batch_input: int = 0
    peak_decode_tokens_per_s: float = 0.0
    #: Seconds between two completions when the batch is full (`saturated_seconds_per_request`).
    drain_s: float = 0.0

    def kv_usage(self) -> float:
        """Share of the KV pool in use (the slot's commitments included); above 1 is overflow."""
        return self.kv_load * self.capacity_bytes / self.pool_bytes if self.pool_bytes else 0.0


class RequestSlot:
    """The feasible servers of `lm` in a window's (or a slot's) snapshot (see the module
    docstring); `slot` is the slot the requests arrived in."""

    def __init__(self, ctx: ClusterContext, obs: RequestWindow | SlotObservation, lm: str) -> None:
        spec = ctx.service(lm).spec
        tokens = spec.engine.tokens
        states = {n.name: n for n in obs.snapshot.nodes}
        self.lm = lm
        self.slot = obs.slot
        self.slot_s = ctx.loop.slot_s
        self.deadline_s = ctx.deadline_s(lm)
        self.servers: list[Server] = []
        for node in ctx.feasible_nodes(lm):
            nspec = ctx.node(node).spec
            state = states.get(node)
            inst = state.instance(lm) if state is not None else None
            modes = ctx.modes(node, lm)
            mode: Literal["gpu", "cpu"] = (
                inst.mode if inst is not None else ("cpu" if modes[:1] == ("cpu",) else "gpu")
            )
            profile = throughput_profile(spec, nspec, mode)
            if tokens is None or profile is None:
                continue
            capacity = (nspec.total_vram_gib if nspec.has_gpu else nspec.memory_gib) * GIB
            pool = kv_capacity_tokens(spec, mode) * tokens.kv_bytes_per_token
            slots = concurrent_requests(spec, mode)
            engine = next((e for e in state.engines or () if e.lm == lm), None) if state else None
            active = engine.running + engine.waiting if engine is not None else 0
            usage = (engine.kv_cache_usage or 0.0) if engine is not None else 0.0
            self.servers.append(
                Server(
                    name=node,
                    profile=profile,
                    slots=slots,
                    kv_bytes=tokens.kv_bytes_per_token,
                    capacity_bytes=capacity,
                    pool_bytes=pool,
                    ready=inst is not None and inst.status == "ready",
                    active=active,
                    kv_load=usage * pool / capacity,
                    count_load=active / slots,
                    peak_decode_tokens_per_s=profile.decode_tokens_per_s(slots),
                    drain_s=saturated_seconds_per_request(profile, slots),
                )
            )

    def latency_s(self, k: int, input_tokens: int) -> float:
        s = self.servers[k]
        out = NOMINAL_OUTPUT_TOKENS
        n = s.active + 1
        b = min(n, s.slots)
        decode = s.profile.decode_tokens_per_s(b)
        t = input_tokens / s.profile.prefill_tokens_per_s + out * b / decode
        if n > s.slots:
            t += (n - s.slots) * s.drain_s
        return t if s.ready else t + COLD_START_S

    def static_latency_s(self, k: int, input_tokens: int) -> float:
        s = self.servers[k]
        size = s.batch_requests + 1
        decode = s.profile.decode_tokens_per_s(min(size, s.slots))
        prefill = (s.batch_input + input_tokens) / s.profile.prefill_tokens_per_s
        return prefill + NOMINAL_OUTPUT_TOKENS * size / decode

    def kv_work(self, k: int, input_tokens: int, latency_s: float | None = None) -> float:
        """`latency_s`: the request's `latency_s(k, input_tokens)` when the caller has it."""
        s = self.servers[k]
        held = s.kv_bytes * (input_tokens + NOMINAL_OUTPUT_TOKENS / 2)
        t = self.latency_s(k, input_tokens) if latency_s is None else latency_s
        return held * t / (s.capacity_bytes * self.slot_s)

    def count_work(self, k: int) -> float:
        return 1.0 / self.servers[k].slots

    def commit(self, k: int, input_tokens: int) -> None:
        """Request with `input_tokens` sent to server k: its loads and batch grow."""
        s = self.servers[k]
        s.kv_load += self.kv_work(k, input_tokens)
        s.count_load += self.count_work(k)
        s.active += 1
        s.batch_requests += 1
        s.batch_input += input_tokens


#: (the LM's servers, the request as an arrival, its input tokens) -> index of the chosen server
Chooser = Callable[[RequestSlot, Arrival, int], int]


def _slots(
    ctx: ClusterContext, obs: RequestWindow | SlotObservation, lms: list[str]
) -> dict[str, RequestSlot]:
    """A `RequestSlot` per servable LM of `lms` (first appearance order)."""
    out: dict[str, RequestSlot] = {}
    for lm in lms:
        if lm not in out and ctx.has_service(lm) and ctx.feasible_nodes(lm):
            out[lm] = RequestSlot(ctx, obs, lm)
    return out


def _walk(slot: RequestSlot, ctx: ClusterContext, a: Arrival, choose: Chooser) -> str:
    """The destination of arrival `a` (committed there), or the first feasible node
    when no server of its LM runs a token engine."""
    if not slot.servers:
        return ctx.feasible_nodes(slot.lm)[0]
    tokens = a.input_tokens if a.input_tokens is not None else NOMINAL_INPUT_TOKENS
    k = choose(slot, a, tokens)
    slot.commit(k, tokens)
    return slot.servers[k].name


def _arrival(w: WindowRequest, lm: str) -> Arrival:
    """A window's request as the `Arrival` a `Chooser` reads (the learner seam's type)."""
    return Arrival.model_construct(
        origin=w.origin,
        lm=lm,
        requests=1,
        prompts=w.prompts,
        request=w.id,
        input_tokens=w.input_tokens,
    )


def route_window(
    window: RequestWindow,
    choose: Chooser,
    begin: Callable[[dict[str, RequestSlot]], None] | None = None,
) -> list[Route]:
    """One route per request of `window`, in order (see the module docstring).

    `begin` sees the window's `RequestSlot` per LM before the first choice (a
    router's virtual queues update there). A request class that is not an LM
    goes to its first model (`ClusterContext.default_model`), as a slot map
    shows it to a router that does not route classes. A request no LM in force
    can serve is routed to its origin: the backend's default routing replaces
    a route it cannot follow.
    """
    ctx = window.context
    models = [w.lm if ctx.has_service(w.lm) else ctx.default_model(w.lm) for w in window.requests]
    slots = _slots(ctx, window, [m for m in models if m is not None])
    if begin is not None:
        begin(slots)
    routes: list[Route] = []
    for w, lm in zip(window.requests, models, strict=True):
        slot = slots.get(lm) if lm is not None else None
        if slot is None or lm is None:
            routes.append(Route(origin=w.origin, lm=w.lm, destination=w.origin))
            continue
        dest = _walk(slot, ctx, _arrival(w, lm), choose)
        routes.append(
            Route(origin=w.origin, lm=w.lm, destination=dest, model=None if lm == w.lm else lm)
        )
    return routes


def slot_map(obs: SlotObservation, policy: str, choose: Chooser) -> Decision[RoutingMap]:
    """The slot's map: each (origin, LM) pair where `choose` sends its first arrival.

    Every arrival is committed to its pair's destination, so later pairs see
    the load. `choose` must leave the router's state alone: the requests
    themselves are routed per window (`route_window`), and the map only
    applies where they are not. LMs without a token-engine server are routed
    to their first feasible node.
    """
    ctx = obs.context
    slots = _slots(ctx, obs, [a.lm for a in obs.arrivals])
    routes: dict[tuple[str, str], Route] = {}
    for a in obs.arrivals:
        slot = slots.get(a.lm)
        if slot is None or a.requests <= 0:
            continue
        hit = routes.get((a.origin, a.lm))
        if hit is None:
            dest = _walk(slot, ctx, a, choose)
            routes[(a.origin, a.lm)] = Route(origin=a.origin, lm=a.lm, destination=dest)
        elif slot.servers:
            tokens = a.input_tokens if a.input_tokens is not None else NOMINAL_INPUT_TOKENS
            slot.commit([s.name for s in slot.servers].index(hit.destination), tokens)
    return Decision[RoutingMap](
        agent="scheduler",
        policy=policy,
        source="rule",
        value=RoutingMap(routes=list(routes.values())),
    )
