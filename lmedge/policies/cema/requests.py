"""Request-level CEMA: one gene per request of a routing window, and the paper's baselines.

The paper (§III-A) admits the requests of a window of Δ seconds (at most
R_m) as one batch and routes each request to a destination (node, model) of
the catalogue (`catalogue.py`). For a batch of R requests over M
destinations, with q̂ the predicted quality, B_d the destination's backlog
(seconds of work already dispatched there), busy/alone a request's seconds
at the saturated / single-request rate (`Destination.service`) and net its
transfer seconds (2 x latency + bits / goodput):

    Q = mean over requests of 1 - q̂(r, d)
    C = Σ token prices x tokens + metered transfer
    E = Σ busy x board power x utilization + net x radio watts
    T = max over requests of net + max(B_d + Σ busy of d's requests, B_d + alone)

(continuous batching: a destination's requests share its saturated rate, and
none finishes before it would alone). J = wQ Q/Q_ub + wC C/C_ub + wE E/E_ub +
wT T/T_ub, with Q_ub, C_ub, E_ub the per-request worst choices summed, and
T_ub the makespan of the load-aware seed: the bound the batch mode uses for T
(worst backlog + every gene's worst service) was 790-920 s against makespans of
17-48 s, so T counted for almost nothing; normalized by the seed, T/T_ub is 1
at the seed, below 1 when the search does better and may pass 1.

`Batch` is a batch as plain arrays: built from a cluster window
(`window_batch`, used by `CemaRouter.route_requests`) or directly for a
controlled experiment (`controlled_batch`: R requests over a catalogue of M
destinations, no emulator); `route_batch` routes it with one of `METHODS` and
returns the assignment with its raw terms, J and decision time, and
`compare` runs B batches through several methods. The search
is the batch mode's compiled kernel, run on per-request terms (`Slot.direct`).
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from lmedge.api.constants import RADIO_WATTS
from lmedge.policies.cema import kernel
from lmedge.policies.cema.catalogue import Destination
from lmedge.policies.cema.evaluator import Weights

Array = np.ndarray[Any, Any]

#: The routing methods of the request mode: CEMA and the paper's baselines.
METHODS = (
    "cema",
    "seed",
    "independent",
    "round-robin",
    "least-loaded",
    "cloud-only",
    "edge-only",
)


@dataclass(frozen=True)
class Request:
    """One request of a window: its class, tokens (predicted output) and payload."""

    id: str
    request_class: str
    input_tokens: int
    output_tokens: int
    prompts: int = 1
    kib: float = 3.0  # request + response payload
    origin: str = ""


@dataclass
class Batch:
    """A window's requests over a catalogue, as arrays ([request, destination])."""

    requests: list[Request]
    dests: list[Destination]
    legal: Array  # bool
    quality: Array  # q̂ in [0, 1]
    backlog: Array  # [destination] seconds
    net: Array  # transfer seconds


@dataclass
class Outcome:
    """What routing a batch gave: a destination index per request, its terms and time."""

    assignment: list[int]
    j: float
    quality_loss: float
    cost: float
    energy: float
    makespan: float
    decision_s: float
    seed_j: float
    busy: list[float] = field(default_factory=list)  # each request's busy seconds there


@dataclass
class RoutingState:
    """What a method keeps between windows: the generator and round robin's position."""

    rng: random.Random = field(default_factory=lambda: random.Random(0))
    next_rr: int = 0


@dataclass(frozen=True)
class SearchParams:
    """The memetic search's parameters (`CemaParams` carries the same)."""

    population: int = 30
    generations: int = 20
    p_crossover: float = 0.9
    p_mutation: float = 0.1
    tournament: int = 3
    elite: int = 2
    p_repair: float = 0.5
    repair_budget: int = 8
    radio_watts: float = RADIO_WATTS


class RequestEvaluator:
    """The batch's terms per (request, destination), the bounds and the load-aware seed."""

    def __init__(self, batch: Batch, weights: Weights, radio_watts: float) -> None:
        r, m = batch.legal.shape
        self.batch = batch
        self.radio_watts = radio_watts
        busy = np.zeros((r, m))
        alone = np.zeros((r, m))
        cost = np.zeros((r, m))
        for i, q in enumerate(batch.requests):
            for d, dest in enumerate(batch.dests):
                if batch.legal[i, d]:
                    busy[i, d], alone[i, d] = dest.service(
                        q.input_tokens, q.output_tokens, q.prompts
                    )
                    cost[i, d] = dest.cost(q.input_tokens, q.output_tokens, q.kib)
        power = np.array([d.watts * d.utilization for d in batch.dests]).reshape(1, m)
        self.busy, self.alone = busy, alone
        direct = np.zeros((r, m, 6))
        direct[:, :, 0] = (1.0 - batch.quality) / max(r, 1)
        direct[:, :, 1] = cost
        direct[:, :, 2] = busy * power + batch.net * radio_watts
        direct[:, :, 3] = busy
        direct[:, :, 4] = batch.net
        direct[:, :, 5] = alone
        alleles = [np.flatnonzero(batch.legal[i]) for i in range(r)]
        off = np.zeros(r + 1, dtype=np.int64)
        off[1:] = np.cumsum([len(a) for a in alleles])
        size = np.array(
            [q.input_tokens + q.output_tokens for q in batch.requests], dtype=float
        ).reshape(r)
        zeros_i = np.zeros(r, dtype=np.int64)
        self.slot = kernel.Slot(
            cls=np.arange(r, dtype=np.int64),
            prompts=size,
            weight=np.full(r, 1.0 / max(r, 1)),
            row=zeros_i,
            node=np.arange(m, dtype=np.int64),
            dest_site=np.zeros(m, dtype=np.int64),
            dest=np.zeros((m, 4)),
            backlog=np.asarray(batch.backlog, dtype=float).reshape(m),
            off=off,
            alleles=np.concatenate(alleles or [np.empty(0, dtype=np.int64)]).astype(np.int64),
            legal=batch.legal.astype(np.bool_),
            loss=1.0 - batch.quality,
            row_node=np.full(1, -1, dtype=np.int64),
            row_site=np.zeros(1, dtype=np.int64),
            lat2=np.zeros((1, 1)),
            bw=np.full((1, 1), np.inf),
            recv_lat2=np.zeros((m, 1)),
            recv_bw=np.full((m, 1), np.inf),
            direct=direct,
        )
        self.bounds, self.seed = kernel.prepare(self.slot, radio_watts)
        # T is normalized by the seed's makespan (see the module docstring)
        self.bounds[3] = self.raw(self.seed.tolist())[3]
        self.weight_array = np.array([weights.quality, weights.cost, weights.energy, weights.time])

    def raw(self, assignment: Sequence[int]) -> tuple[float, float, float, float]:
        """(Q, C, E, T) of an assignment; Q is the mean quality loss."""
        q, c, e, t = kernel.raw(self.slot, self.radio_watts, np.asarray(assignment, np.int64))
        return float(q), float(c), float(e), float(t)

    def fitness(self, assignment: Sequence[int]) -> float:
        """J, lower is better."""
        values = kernel.raw(self.slot, self.radio_watts, np.asarray(assignment, np.int64))
        return float(kernel.fitness(values, self.bounds, self.weight_array))

    def alone_j(self, i: int, d: int) -> float:
        """Request i's J at d as if it were the batch's only request (no joint term)."""
        b, w = self.bounds, self.weight_array
        t = self.slot.direct[i, d]
        finish = self.batch.backlog[d] + max(t[3], t[5]) + t[4]
        terms = (t[0], t[1], t[2], finish)
        return float(sum(w[k] * terms[k] / b[k] for k in range(4) if b[k] > 0))


def route_batch(
    batch: Batch,
    method: str = "cema",
    weights: Weights | None = None,
    params: SearchParams | None = None,
    state: RoutingState | None = None,
) -> Outcome:
    """Route one batch with `method` (one of `METHODS`); every method is scored by one evaluator.

    The decision time covers building the evaluator and the method's choice.
    """
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; known: {', '.join(METHODS)}")
    w = weights or Weights(0.25, 0.25, 0.25, 0.25)
    p = params or SearchParams()
    st = state or RoutingState()
    started = time.perf_counter()
    ev = RequestEvaluator(batch, w, p.radio_watts)
    chosen = choose(ev, method, p, st)
    decision = time.perf_counter() - started
    q, c, e, t = ev.raw(chosen)
    busy = [float(ev.busy[i, d]) for i, d in enumerate(chosen)]
    return Outcome(
        chosen, ev.fitness(chosen), q, c, e, t, decision, ev.fitness(ev.seed.tolist()), busy
    )


def compare(
    batches: Sequence[Batch],
    methods: Sequence[str] = METHODS,
    weights: Weights | None = None,
    params: SearchParams | None = None,
    seed: int = 0,
) -> dict[str, list[Outcome]]:
    """Route every batch with every method: a controlled experiment in one call.

    Each method gets its own `RoutingState` seeded by `seed` (so CEMA's
    search and round robin's position run on from batch to batch, as in a
    router), and every outcome is scored by the same evaluator.
    """
    out: dict[str, list[Outcome]] = {}
    for method in methods:
        state = RoutingState(rng=random.Random(seed))
        out[method] = [route_batch(b, method, weights, params, state) for b in batches]
    return out


def choose(ev: RequestEvaluator, method: str, p: SearchParams, st: RoutingState) -> list[int]:
    """The destination index per request that `method` picks."""
    batch = ev.batch
    if not batch.requests:
        return []
    if method == "cema":
        return search(ev, p, st.rng)
    if method == "seed":
        return list(ev.seed.tolist())
    legal = batch.legal
    if method == "independent":
        out = []
        for i in range(len(batch.requests)):
            options = np.flatnonzero(legal[i]).tolist()
            scores = [ev.alone_j(i, d) for d in options]
            out.append(options[scores.index(min(scores))])  # the first of equals
        return out
    if method == "round-robin":
        out = []
        m = len(batch.dests)
        for i in range(len(batch.requests)):
            for k in range(m):
                d = (st.next_rr + k) % m
                if legal[i, d]:
                    out.append(d)
                    st.next_rr = d + 1
                    break
        return out
    if method in ("cloud-only", "edge-only"):
        tier = method.removesuffix("-only")
        inside = np.array([d.tier == tier for d in batch.dests])
        restricted = legal & inside
        # a request no destination of the tier can serve keeps its legal ones
        legal = np.where(restricted.any(axis=1, keepdims=True), restricted, legal)
    # least outstanding work (the monitor's backlog plus what this window added)
    work = np.asarray(batch.backlog, dtype=float).copy()
    picks: list[int] = []
    for i in range(len(batch.requests)):
        candidates = np.flatnonzero(legal[i])
        d = int(candidates[np.argmin(work[candidates])])
        picks.append(d)
        work[d] += ev.busy[i, d]
    return picks


class Searchable(Protocol):
    """What the search reads of an evaluator: `RequestEvaluator` and the batch mode's
    `evaluator.BatchEvaluator` both are one."""

    slot: kernel.Slot
    radio_watts: float
    seed: Array
    bounds: Array
    weight_array: Array


def search(ev: Searchable, p: SearchParams, rng: random.Random) -> list[int]:
    """The memetic search (the compiled kernel) from the evaluator's seed; advances `rng`.

    The kernel draws from `rng`'s own MT19937 state, so a seed gives the same
    routes as the plain-Python search and the generator runs on from there.
    """
    version, words, gauss = rng.getstate()
    mt = np.array(words[:-1], dtype=np.uint32)
    pos = np.array([words[-1]], dtype=np.int64)
    best = kernel.search(
        ev.slot,
        ev.radio_watts,
        ev.seed,
        ev.bounds,
        ev.weight_array,
        np.array([p.p_crossover, p.p_mutation, p.p_repair]),
        np.array(
            [p.population, p.generations, p.tournament, p.elite, p.repair_budget], dtype=np.int64
        ),
        mt,
        pos,
    )
    rng.setstate((version, (*mt.tolist(), int(pos[0])), gauss))
    return list(best.tolist())


class Monitor:
    """The router's in-flight view B_d from its own dispatches (paper §III-B).

    Each destination's backlog drains at one second per second and grows by
    the busy seconds of what is dispatched there, so the router needs no
    endpoint telemetry.
    """

    def __init__(self) -> None:
        self.work: dict[tuple[str, str], float] = {}
        self.at = 0.0

    def backlog(self, now: float, pairs: Sequence[tuple[str, str]]) -> Array:
        """B_d of each pair at `now`."""
        self._drain(now)
        return np.array([self.work.get(p, 0.0) for p in pairs], dtype=float).reshape(len(pairs))

    def dispatch(self, now: float, pairs: Sequence[tuple[str, str]], busy: Sequence[float]) -> None:
        """Add the busy seconds of the requests just sent to `pairs`."""
        self._drain(now)
        for p, s in zip(pairs, busy, strict=True):
            self.work[p] = self.work.get(p, 0.0) + s

    def _drain(self, now: float) -> None:
        elapsed = max(0.0, now - self.at)
        self.at = max(self.at, now)
        if elapsed:
            self.work = {p: w - elapsed for p, w in self.work.items() if w > elapsed}


def controlled_batch(
    requests: Sequence[Request],
    dests: Sequence[Destination],
    quality: Array,
    backlog: Array | None = None,
) -> Batch:
    """A batch for a controlled experiment: every destination legal for every request.

    `quality` is q̂ [request, destination]; transfer from the router to each
    destination is 2 x its latency + the request's payload bits / its goodput.
    """
    r, m = len(requests), len(dests)
    net = np.array(
        [
            [2 * d.latency_s + q.kib * kernel.KIB_BITS / d.goodput_bps for d in dests]
            for q in requests
        ]
    ).reshape(r, m)
    return Batch(
        list(requests),
        list(dests),
        np.ones((r, m), dtype=bool),
        np.asarray(quality, dtype=float).reshape(r, m),
        np.zeros(m) if backlog is None else np.asarray(backlog, dtype=float),
        net,
    )
