"""Per-request routing over token-engine servers: the slot as such a router sees it.

LYREO's scheduler and its baselines send each request to a server (not each
(origin, LM) pair): `route_requests` walks the slot's arrivals in order, asks
the router's `choose` for a server among those that can host the LM, commits
the request there (so the next choice sees it), and returns a `RoutingMap`
with one `Assignment` per named request and a route for any arrival without
an id (an aggregate count: its pair goes where its first request would).

`RequestSlot` holds, per feasible server of one LM, what the snapshot says
(running and waiting sequences, KV-pool usage of the LM's engine) and what
the LM's manifest says for that hardware (prefill rate, decode curve, batch
slots, KV pool), and estimates for one more request with `input` prompt
tokens and the nominal output (215 tokens: the output is not known before it
ends):

- `latency_s`: continuous batching, n = active requests with it:
  input / prefill + out * b / decode(b), b = min(n, slots), plus a queue of
  max(0, n - slots) * out / decode(slots) when the batch is full, plus a cold
  start when the LM is not running there.
- `static_latency_s`: static batching with single-slot completion (the
  model LYREO argues against): only this slot's batch on the server,
  sum(input) / prefill + out * k / decode(k), k its size; carried-over
  requests are ignored.
- `kv_work`: the request's normalized KV memory-time, kv bytes x (input +
  out / 2) tokens held on average x `latency_s` / (M_s x slot), M_s the
  server's GPU memory (`lmedge.metrics`' W_s).
- `count_work`: 1 / batch slots (LYREO-Count's workload).

Loads at the slot start: `kv_load` = KV-pool usage x pool bytes / M_s (the
memory-time the server holds over one slot at its current occupancy),
`count_load` = active / batch slots. Pure: no randomness, no clock.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from lmedge.api import (
    Arrival,
    Assignment,
    ClusterContext,
    Decision,
    Route,
    RoutingMap,
    SlotObservation,
)
from lmedge.api.constants import COLD_START_S
from lmedge.api.engines import (
    GIB,
    NOMINAL_INPUT_TOKENS,
    NOMINAL_OUTPUT_TOKENS,
    ThroughputProfile,
    concurrent_requests,
    kv_capacity_tokens,
    throughput_profile,
)

__all__ = ["RequestSlot", "Server", "route_requests"]


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

    def kv_usage(self) -> float:
        """Share of the KV pool in use (the slot's commitments included); above 1 is overflow."""
        return self.kv_load * self.capacity_bytes / self.pool_bytes if self.pool_bytes else 0.0


class RequestSlot:
    """The feasible servers of `lm` at the start of a slot (see the module docstring)."""

    def __init__(self, ctx: ClusterContext, obs: SlotObservation, lm: str) -> None:
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
            t += (n - s.slots) * out / s.profile.decode_tokens_per_s(s.slots)
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


#: (the LM's slot, the arrival, its input tokens) -> index of the chosen server
Chooser = Callable[[RequestSlot, Arrival, int], int]


def route_requests(
    obs: SlotObservation,
    policy: str,
    choose: Chooser,
    begin: Callable[[dict[str, RequestSlot]], None] | None = None,
) -> Decision[RoutingMap]:
    """Route every arrival of `obs` one request at a time (see the module docstring).

    `begin` sees the slot's `RequestSlot` per LM before the first choice (a
    router's virtual queues update there). LMs without a token-engine server
    are routed to their first feasible node.
    """
    ctx = obs.context
    slots: dict[str, RequestSlot] = {}
    for a in obs.arrivals:
        if a.lm not in slots and ctx.has_service(a.lm) and ctx.feasible_nodes(a.lm):
            slots[a.lm] = RequestSlot(ctx, obs, a.lm)
    if begin is not None:
        begin(slots)
    assignments: list[Assignment] = []
    routes: dict[tuple[str, str], Route] = {}
    for a in obs.arrivals:
        slot = slots.get(a.lm)
        if slot is None or a.requests <= 0:
            continue
        if not slot.servers:
            dest = ctx.feasible_nodes(a.lm)[0]
        else:
            tokens = a.input_tokens if a.input_tokens is not None else NOMINAL_INPUT_TOKENS
            k = choose(slot, a, tokens)
            slot.commit(k, tokens)
            dest = slot.servers[k].name
        if a.request is not None:
            assignments.append(Assignment(request=a.request, destination=dest))
        routes.setdefault((a.origin, a.lm), Route(origin=a.origin, lm=a.lm, destination=dest))
    return Decision[RoutingMap](
        agent="scheduler",
        policy=policy,
        source="rule",
        value=RoutingMap(routes=list(routes.values()), assignments=assignments),
    )
