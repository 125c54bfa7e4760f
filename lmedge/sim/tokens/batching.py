"""One token-level engine instance (a llama.cpp or vLLM pod) with continuous batching.

A pure state machine in virtual time: no SimPy, no clock, no randomness. The
emulator drives it event by event: `submit` a request when it reaches the
pod, `set_share` when the pod's time-slicing share of its GPU (or CPU)
changes, `advance` to the time of `next_event_time()` (or any later time) to
collect the requests that finished. Formulas and choices are in the README
beside this module.

It does not route, queue across pods, model the network or decide the share:
those stay with the caller.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Literal

from lmedge.api.engines import ThroughputProfile

Step = Literal["prefill", "decode"]
#: Seconds of float rounding tolerated between the engine's clock and its driver's
#: (a step ending at t is due at `now + (t - now)`, which may round below t).
_EPS = 1e-9


@dataclass(slots=True)
class TokenRequest:
    """A request as the engine sees it: times are filled in as it is served."""

    rid: int
    arrival_s: float
    input_tokens: int
    output_tokens: int
    admitted_s: float = math.nan
    first_token_s: float = math.nan
    finish_s: float = math.nan
    #: Board-seconds charged to it: over its admission, each step's time x the engine's
    #: share split evenly among the sequences admitted (filled in when it leaves).
    board_s: float = 0.0
    board_from: float = math.nan  # the engine's `board_clock` at its admission

    @property
    def kv_tokens(self) -> int:
        """KV the request holds at its peak: its prompt and every output token."""
        return self.input_tokens + self.output_tokens

    @property
    def ttft_s(self) -> float:
        """Time to first token: arrival at the engine to the end of its prefill."""
        return self.first_token_s - self.arrival_s

    @property
    def tpot_s(self) -> float:
        """Time per output token after the first (0 for a one-token answer)."""
        if self.output_tokens <= 1:
            return 0.0
        return (self.finish_s - self.first_token_s) / (self.output_tokens - 1)

    @property
    def e2e_s(self) -> float:
        """Arrival at the engine to the last token."""
        return self.finish_s - self.arrival_s


@dataclass(frozen=True, slots=True)
class KVSample:
    """KV held (`used`, tokens written) and reserved (peak of admitted sequences) at `t_s`."""

    t_s: float
    used_tokens: int
    reserved_tokens: int


@dataclass
class BatchingEngine:
    """Continuous batching at the iteration level (see the README for the model).

    `profile` gives prefill tokens/s and the decode curve of one uncontended
    instance; `share` (0, 1] scales both (time-slicing); KV is counted in tokens
    (`kv_capacity_tokens`, from `lmedge.api.engines.kv_capacity_tokens`).
    """

    profile: ThroughputProfile
    kv_capacity_tokens: int
    max_running: int
    start_s: float = 0.0
    #: False: a prefill step stalls the running sequences (vLLM's V0 scheduler).
    #: True: they decode one token in the prefill's batch, and the step also takes
    #: one decode iteration of the running and the new sequences (llama-server's
    #: batches: one forward pass samples a token for each).
    mixed: bool = False

    now_s: float = field(init=False)
    share: float = field(init=False, default=1.0)
    waiting: deque[TokenRequest] = field(init=False, default_factory=deque)
    timeline: list[KVSample] = field(init=False, default_factory=list)
    #: integral of KV tokens held over time (token-seconds); x bytes/token = memory-time
    kv_token_s: float = field(init=False, default=0.0)
    #: integral of share / running over the time a step runs: the board-seconds one
    #: admitted sequence has been charged since the start. A sequence's charge is the
    #: difference over its admission, so the charges of all sequences sum to the
    #: engine's busy seconds x share, never to more (continuous batching shares a board).
    board_clock: float = field(init=False, default=0.0)
    steps: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        if self.kv_capacity_tokens < 1 or self.max_running < 1:
            raise ValueError("kv_capacity_tokens and max_running must be at least 1")
        self.now_s = self.start_s
        # Aggregate decode tokens/s by running count, looked up at every span.
        self._decode = [0.0] + [
            self.profile.decode_tokens_per_s(n) for n in range(1, self.max_running + 1)
        ]
        self._prefill = self.profile.prefill_tokens_per_s
        self._k = 0  # decode iterations done since the start
        self._decoding: list[tuple[int, int, int, TokenRequest]] = []  # (finish k, order, k0, req)
        self._order = 0
        self._batch: list[TokenRequest] = []  # being prefilled
        self._running = 0  # admitted and not finished: prefilling + decoding
        self._reserved = 0  # sum of kv_tokens of admitted requests
        # KV written = _base + len(_decoding) * (_k + iterations done in the current span)
        self._base = 0
        self._step: Step | None = None
        self._work = 0.0  # uncontended seconds the current step needs
        self._done = 0.0  # ... and has had
        self._iter = 0.0  # uncontended seconds of one decode iteration of the current span
        self._iters = 0  # iterations of the current span
        self._mixed_decode = False  # the prefill step under way also decodes one token

    # -- the driver's interface ---------------------------------------------------

    @property
    def busy(self) -> bool:
        """Whether a prefill or decode step is running (the pod contends for its GPU)."""
        return self._step is not None

    @property
    def running(self) -> int:
        """Sequences admitted and not finished."""
        return self._running

    @property
    def kv_reserved_tokens(self) -> int:
        return self._reserved

    @property
    def kv_used_tokens(self) -> int:
        """KV written now: prompts being prefilled or done, and output tokens so far."""
        done = int(self._done / self._iter) if self._step == "decode" else 0
        return self._base + len(self._decoding) * (self._k + done)

    def next_event_time(self) -> float | None:
        """When the current step ends (None when idle)."""
        if self._step is None:
            return None
        return self.now_s + (self._work - self._done) / self.share

    def submit(self, req: TokenRequest, now_s: float) -> None:
        """`req` reaches the engine at `now_s` (>= the engine's time); it queues FIFO.

        A request that joins an idle engine, or a prefill that has not
        started, is prefilled at once; one that arrives during a decode span
        and can be admitted cuts the span at the end of the iteration in
        progress. A request that could never fit the KV pool is refused
        (ValueError): the caller clips lengths to the context.
        """
        if req.kv_tokens > self.kv_capacity_tokens:
            raise ValueError(
                f"request {req.rid} needs {req.kv_tokens} KV tokens; "
                f"the pool holds {self.kv_capacity_tokens}"
            )
        self._sync(now_s)
        self.waiting.append(req)
        if len(self.waiting) > 1 or not self._admissible(req):
            return
        if self._step is None:
            self._start_step()
        elif self._step == "prefill" and self._done == 0.0:
            self._admit()
            self._work = self._prefill_work()
        elif self._step == "decode":
            self._cut()

    def cancel(self, req: TokenRequest, now_s: float) -> None:
        """Take `req` out of the engine at `now_s` (its client gave up): its KV is freed.

        Waiting, it leaves the queue; being prefilled, it leaves the batch
        (a prefill under way keeps its length: the batch's work is not
        undone); decoding, it leaves the span, whose iterations keep their
        length until the next step. A freed reservation lets the queue's head
        in at the end of the iteration in progress, as an arrival would.
        """
        self._sync(now_s)
        if req in self.waiting:
            self.waiting.remove(req)
        elif req in self._batch:
            self._batch.remove(req)
            self._charge(req)
            self._running -= 1
            self._reserved -= req.kv_tokens
            self._base -= req.input_tokens
            if self._done == 0.0:
                self._work = self._prefill_work()
        else:
            k = next((k for k, e in enumerate(self._decoding) if e[3] is req), -1)
            if k < 0:
                return
            entry = self._decoding[k]
            self._decoding[k] = self._decoding[-1]
            self._decoding.pop()
            heapq.heapify(self._decoding)
            self._charge(req)
            self._running -= 1
            self._reserved -= req.kv_tokens
            self._base -= req.input_tokens + 1 - entry[2]
        if self._step == "decode" and not self._decoding:
            self._start_step()  # nothing left to decode: an idle engine, or a prefill
        elif self._step == "decode" and self.waiting and self._admissible(self.waiting[0]):
            self._cut()

    def kv_token_s_at(self, t_s: float) -> float:
        """`kv_token_s` integrated to `t_s` (>= the engine's time) without moving the engine."""
        dt = max(0.0, t_s - self.now_s)
        n = len(self._decoding)
        total = self.kv_token_s + (self._base + n * self._k) * dt
        if self._step == "decode":
            a = self._done
            b = min(self._work, a + dt * self.share)
            w = self._iter
            total += n * w * (_floor_integral(b / w) - _floor_integral(a / w)) / self.share
        return total

    def board_s_at(self, req: TokenRequest, t_s: float) -> float:
        """`req`'s board-seconds to `t_s` (>= the engine's time) without moving the engine:
        its charge so far when admitted and not finished, else `req.board_s`."""
        if req.board_from != req.board_from:  # not admitted now
            return req.board_s
        clock = self.board_clock
        if self._step is not None and self._running:
            clock += max(0.0, t_s - self.now_s) * self.share / self._running
        return req.board_s + clock - req.board_from

    def _charge(self, req: TokenRequest) -> None:
        """`req` leaves the admitted set now: its board-seconds are final."""
        req.board_s += self.board_clock - req.board_from
        req.board_from = math.nan

    def _cut(self) -> None:
        """End the decode span at the end of the iteration in progress."""
        cut = max(1, math.ceil(self._done / self._iter - 1e-9))
        if cut < self._iters:
            self._iters = cut
            self._work = cut * self._iter

    def set_share(self, share: float, now_s: float) -> None:
        """From `now_s` on, the engine runs at `share` of its uncontended speed."""
        if not 0.0 < share <= 1.0:
            raise ValueError(f"share must be in (0, 1], got {share}")
        self._sync(now_s)
        self.share = share

    def advance(self, until_s: float) -> list[TokenRequest]:
        """Run every step that ends by `until_s`; the requests finished, in finishing order."""
        finished: list[TokenRequest] = []
        while self._step is not None:
            end = self.now_s + (self._work - self._done) / self.share
            if end > until_s + _EPS:
                break
            self._sync(max(end, self.now_s))
            self._done = self._work
            self._end_step(finished)
        self._sync(until_s)
        return finished

    # -- internals ----------------------------------------------------------------

    def _admissible(self, req: TokenRequest) -> bool:
        """Peak-memory admission: its whole KV fits beside the admitted ones, and a slot is free."""
        return (
            self._running < self.max_running
            and self._reserved + req.kv_tokens <= self.kv_capacity_tokens
        )

    def _admit(self) -> None:
        while self.waiting and self._admissible(self.waiting[0]):
            req = self.waiting.popleft()
            req.admitted_s = self.now_s
            req.board_from = self.board_clock
            self._running += 1
            self._reserved += req.kv_tokens
            self._base += req.input_tokens  # the prompt's KV is written by the prefill
            self._batch.append(req)

    def _sync(self, t: float) -> None:
        """Move the clock to `t`, integrating the KV held (exact within a decode span)."""
        dt = t - self.now_s
        if dt < -_EPS:
            raise ValueError(f"time runs backwards: {t} < {self.now_s}")
        if dt <= 0:
            return  # (a driver's clock may lag a step's end by rounding: _EPS)
        n = len(self._decoding)
        held = self._base + n * self._k
        self.kv_token_s += held * dt
        if self._step is not None:
            if self._running:
                self.board_clock += dt * self.share / self._running
            a = self._done
            b = a + dt * self.share
            if self._step == "decode":
                # tokens appended at each iteration's end: + n * floor(work / iter)
                w = self._iter
                self.kv_token_s += (
                    n * w * (_floor_integral(b / w) - _floor_integral(a / w)) / self.share
                )
            self._done = b
        self.now_s = t

    def _end_step(self, finished: list[TokenRequest]) -> None:
        self.steps += 1
        if self._step == "prefill":
            if self._mixed_decode:  # the running sequences took a token in this batch
                self._k += 1
                while self._decoding and self._decoding[0][0] <= self._k:
                    _, _, k0, req = heapq.heappop(self._decoding)
                    self._finish(req, req.input_tokens + 1 - k0, finished)
            for req in self._batch:
                req.first_token_s = self.now_s
                if req.output_tokens <= 1:
                    self._finish(req, req.input_tokens, finished)
                    continue
                # written: prompt + first token; + one token per later iteration
                self._base += 1 - self._k
                self._order += 1
                heapq.heappush(
                    self._decoding, (self._k + req.output_tokens - 1, self._order, self._k, req)
                )
            self._batch = []
        else:
            self._k += self._iters
            while self._decoding and self._decoding[0][0] <= self._k:
                _, _, k0, req = heapq.heappop(self._decoding)
                self._finish(req, req.input_tokens + 1 - k0, finished)
        self._start_step()

    def _prefill_work(self) -> float:
        """Uncontended seconds of the prefill step: the batch's prompts at the prefill
        rate; in a mixed batch also one decode iteration of every sequence in it, the
        running ones and the new ones (each samples one token: a new prompt its first)."""
        work = sum(r.input_tokens for r in self._batch) / self._prefill
        if self.mixed and (n := len(self._decoding) + len(self._batch)):
            work += n / self._decode[n]
        return work

    def _finish(self, req: TokenRequest, base: int, finished: list[TokenRequest]) -> None:
        req.finish_s = self.now_s
        self._charge(req)
        self._base -= base
        self._running -= 1
        self._reserved -= req.kv_tokens
        finished.append(req)

    def _start_step(self) -> None:
        """Prefill the admissible head of the queue if any, else decode, else idle."""
        self._done = 0.0
        self._admit()
        if self._batch:
            self._step = "prefill"
            self._mixed_decode = self.mixed and bool(self._decoding)
            self._work = self._prefill_work()
        elif self._decoding:
            n = len(self._decoding)
            self._step = "decode"
            self._iter = n / self._decode[n]
            self._iters = self._decoding[0][0] - self._k  # to the next finish
            self._work = self._iters * self._iter
        else:
            self._step = None
        self.timeline.append(KVSample(self.now_s, self.kv_used_tokens, self._reserved))


def _floor_integral(y: float) -> float:
    """Integral of floor(u) du from 0 to y (y >= 0)."""
    f = math.floor(y)
    return f * (f - 1) / 2 + f * (y - f)
