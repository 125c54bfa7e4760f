"""Calibrate a llama.cpp token profile on this machine and check the emulator against it.

`lmedge calibrate --engine llama.cpp` runs, against one real `llama-server`
(`lmedge.bench.llama_server`: `--parallel` slots, continuous batching, a
unified KV cache, no prompt cache, no context checkpoints, `--threads`
explicit):

1. **Decode.** k requests started together with short prompts, at every k
   up to `parallel` (`decode_counts`); each one's time per output token is
   one iteration of a batch of k. The iteration time t(k) is the median
   repeat at each k (`fit_iteration_times`; not a line a + b k: on
   llama-server's CPU build t(2) is about 2 t(1) and t(4) about t(3), and
   the line was 15-20% off at k = 1 and 3), and the curve is
   decode(k) = k / t(k): aggregate rising, per sequence falling, as
   `ThroughputProfile` requires.
2. **Prefill.** Single requests with prompts at the trace's input-length
   quantiles and one output token; the client's time to first token T(n),
   the median of the repeats at each n. In the emulator's llama.cpp model a
   prompt alone takes n / rate + t(1) (the forward pass also samples the
   first token: `BatchingEngine`, mixed batches), so the rate is fitted to
   T(n) - t(1), minimising the relative error of the TTFT (`fit_prefill_rate`).
   Steps 1-2 are the profile (engine.yaml).
3. **Sustained burst.** A saturating burst (`SUSTAINED_FACTOR` x `parallel`
   requests with the trace's length distribution but their own seed, sent
   `SUSTAINED_GAP_S` apart so that the server queues them in the emulator's
   order) is timed on the server and emulated with the profile: a check at
   saturation, with long prompts, reported stage by stage. It is not fitted:
   scaling the profile to it (earlier versions) made the replays worse when
   its longest prompt, slower per token than the short ones, set the level.
4. **Replays.** Right before each replay the isolated requests of steps 1-2
   are re-timed (`RETIME_REPEATS` repeats): the machine's single-thread speed
   drifts by 10-25% within a run (neighbours' cache and frequency effects,
   which the CPU clock below does not remove), so the replay is emulated
   with the profile scaled to the level of its own moment (`level_factors`);
   the shape (prefill rate, t(k)) stays the profile's. A seeded trace
   (lognormal lengths from `lmedge.sim.tokens.lengths`, on/off Poisson
   arrivals) at each of `LOADS` (below saturation, and bursts over it) is
   sent to the server (streamed, one asyncio client) and run through
   `BatchingEngine` with the re-timed profile; each request's TTFT,
   TPOT and end-to-end latency are compared: relative error
   |predicted - measured| / measured, median and P90. Each request's time is
   also split into stages (`Stages`: the client's send lag, the wait for a
   slot, prefill, decode; llama-server's response headers mark the
   admission), measured and emulated, so a miss shows where it comes from.

**The clock.** `clock="wall"` times everything by the machine's clock: right
on a machine of its own. `clock="cpu"` (the default) times the server by its
model thread's CPU time while it has requests in flight and by the wall
clock while it has none (`ServerClock`, `--threads 1`): on a shared machine
a server that waits for a core does not count the wait, so the comparison
measures the engine and not the neighbours' load.

The emulator's assumptions this checks (`lmedge/sim/tokens/README.md`):
FIFO admission into `parallel` slots at iteration boundaries; the prompts
admitted together prefilled in one forward pass that also decodes one token
of every running sequence; one token per running sequence per iteration.

It does not edit manifests: the profile is written as an `engine:` snippet.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from lmedge.api.engines import (
    ANY_GPU,
    DecodePoint,
    EngineSpec,
    GpuThroughputProfile,
    ThroughputProfile,
    TokenProfile,
    mixed_batches,
)
from lmedge.bench.llama_server import (
    Call,
    ClockKind,
    Completion,
    LlamaServer,
    ServerConfig,
    kv_bytes_per_token,
    running_llama_server,
)
from lmedge.sim.tokens import BatchingEngine, TokenRequest
from lmedge.sim.tokens.lengths import LengthSampler, LognormalLengths

GIB = 1024**3
METRICS = ("ttft", "tpot", "e2e")
#: The issue's targets: median and P90 relative error on each metric.
TARGET_MEDIAN = 0.15
TARGET_P90 = 0.30


# -- the trace ------------------------------------------------------------------------


@dataclass(frozen=True)
class TraceSpec:
    """A replay trace: lengths (scaled to a small model) and on/off Poisson arrivals.

    During an ON period (exponential, mean `on_s`) requests arrive as a
    Poisson process of `rate_on` per second; none during an OFF period
    (exponential, mean `off_s`). Lengths: lognormal means and sigmas as in
    `LognormalLengths`, clipped to the slot's context. `rate_on` None: set
    from the calibrated profile so that an ON period offers `burst_load`
    times what the engine serves at full batch (`capacity_per_s`); the trace
    then has the same shape on any machine, scaled to its speed.
    """

    requests: int = 120
    seed: int = 1
    input_mean: float = 70.0
    input_sigma: float = 1.0
    output_mean: float = 40.0
    output_sigma: float = 0.8
    rate_on: float | None = None
    burst_load: float = 1.3
    on_s: float = 8.0
    off_s: float = 8.0


@dataclass(frozen=True)
class TraceRequest:
    rid: int
    arrival_s: float
    input_tokens: int
    output_tokens: int


def bursty_arrivals(
    rng: np.random.Generator, n: int, rate_on: float, on_s: float, off_s: float
) -> np.ndarray:
    """`n` arrival times (s, from 0) of an on/off Poisson process (see `TraceSpec`)."""
    times: list[float] = []
    t = 0.0
    while len(times) < n:
        end = t + rng.exponential(on_s)
        while len(times) < n:
            t += rng.exponential(1.0 / rate_on)
            if t > end:
                t = end
                break
            times.append(t)
        t += rng.exponential(off_s)
    first = times[0]
    return np.array([x - first for x in times])


def capacity_per_s(profile: ThroughputProfile, max_running: int, spec: TraceSpec) -> float:
    """Requests/s a busy engine serves for the trace's mean lengths.

    A request costs input / prefill plus output / decode(max_running) of the
    engine's time (the capacity-equivalent cost, as `nominal_seconds_per_prompt`).
    """
    per_request = spec.input_mean / profile.prefill_tokens_per_s + spec.output_mean / (
        profile.decode_tokens_per_s(max_running)
    )
    return 1.0 / per_request


def make_trace(spec: TraceSpec, context_tokens: int, rate_on: float) -> list[TraceRequest]:
    """The seeded trace: same spec and rate, same requests (`spec.rate_on` wins over `rate_on`)."""
    # Two streams: the lengths do not depend on the rate (the arrivals draw more at a higher one).
    lengths_rng, arrivals_rng = np.random.default_rng(spec.seed).spawn(2)
    rate = spec.rate_on if spec.rate_on is not None else rate_on
    arrivals = bursty_arrivals(arrivals_rng, spec.requests, rate, spec.on_s, spec.off_s)
    lengths = LognormalLengths(
        input_mean=spec.input_mean,
        input_sigma=spec.input_sigma,
        output_mean=spec.output_mean,
        output_sigma=spec.output_sigma,
    )
    inp, out = LengthSampler(lengths).draw(lengths_rng, spec.requests, context_tokens)
    return [
        TraceRequest(i, float(a), int(x), int(y))
        for i, (a, x, y) in enumerate(zip(arrivals, inp, out, strict=True))
    ]


# -- fitting ----------------------------------------------------------------------------


def _central(samples: Sequence[tuple[int, float]]) -> tuple[np.ndarray, np.ndarray]:
    """(distinct x, median y at each): the speed the server keeps, not its best moment
    (the fastest repeat made the profile optimistic, and the replay's queues grew from it)."""
    xs = sorted({x for x, _ in samples})
    return (
        np.array(xs, dtype=float),
        np.array([float(np.median([y for x2, y in samples if x2 == x])) for x in xs]),
    )


def fit_prefill_rate(samples: Sequence[tuple[int, float]], fixed_s: float = 0.0) -> float:
    """Prompt tokens/s from (prompt tokens n, seconds to first token T) samples.

    The model's TTFT of a prompt alone is n / rate + `fixed_s` (in a mixed
    batch, `fixed_s` is the decode iteration that samples the first token:
    `BatchingEngine`). T is the median of the samples at each n. Minimises
    sum((n / rate + f - T)^2 / T^2), the squared relative error of the
    model's TTFT: 1 / rate = sum(n (T - f) / T^2) / sum(n^2 / T^2).
    """
    if not samples or any(n <= 0 or t <= 0 for n, t in samples):
        raise ValueError("prefill samples need positive token counts and times")
    n, t = _central(samples)
    inverse = float(np.sum(n * (t - fixed_s) / t**2) / np.sum(n**2 / t**2))
    if inverse <= 0:
        raise ValueError(
            f"the prefill times ({', '.join(f'{x:.3f}' for x in t)} s) do not exceed "
            f"the fixed cost of a step ({fixed_s:.3f} s)"
        )
    return 1.0 / inverse


def decode_counts(max_running: int) -> list[int]:
    """The running counts the decode sweep measures: every count up to 8, then doublings
    and `max_running` (the iteration time is not linear in k: on llama-server's CPU
    build one token of 2 sequences costs 2x one of 1, of 3 and 4 sequences about the same)."""
    if max_running < 1:
        raise ValueError(f"max_running must be at least 1, got {max_running}")
    counts = list(range(1, min(max_running, 8) + 1))
    while counts[-1] * 2 < max_running:
        counts.append(counts[-1] * 2)
    return sorted({*counts, max_running})


def fit_iteration_times(samples: Sequence[tuple[int, float]], max_running: int) -> list[float]:
    """Seconds of one decode iteration t(k) at k = 1 .. `max_running`, from (running k,
    seconds per token) samples.

    The median repeat at each measured k; linear in k between measured counts,
    flat before the first and after the last. Then the profile's rules, in k
    order: t(k) never falls (per-sequence tokens/s never rise) and t(k) / k
    never rises (aggregate tokens/s never fall), so a noisy k is clipped to
    the nearest value its smaller neighbour allows.
    """
    if not samples or any(k < 1 or t <= 0 for k, t in samples):
        raise ValueError("decode samples need running >= 1 and positive times")
    if max_running < 1:
        raise ValueError(f"max_running must be at least 1, got {max_running}")
    k, t = _central(samples)
    times = [float(x) for x in np.interp(np.arange(1, max_running + 1), k, t)]
    for i in range(1, len(times)):
        times[i] = min(max(times[i], times[i - 1]), times[i - 1] * (i + 1) / i)
    return times


def decode_curve(iteration_s: Sequence[float]) -> list[DecodePoint]:
    """decode(k) = k / t(k) at k = 1 .. len(iteration_s) (aggregate tokens/s).

    `iteration_s` as `fit_iteration_times` gives it (t never falls, t / k
    never rises); a value is nudged down by an ulp where rounding would make
    the per-sequence rate rise (the profile rejects that).
    """
    values: list[float] = []
    for k, t in enumerate(iteration_s, start=1):
        v = k / t
        while values and v * (k - 1) > values[-1] * k:
            v = math.nextafter(v, 0.0)
        values.append(v)
    return [DecodePoint(running=k, tokens_per_s=v) for k, v in enumerate(values, start=1)]


def scaled(profile: ThroughputProfile, prefill: float, decode: float) -> ThroughputProfile:
    """The profile with its prefill speed divided by `prefill`, its decode curve by `decode`."""
    if not (prefill > 0 and decode > 0):
        raise ValueError(f"speed scales must be positive, got {prefill}, {decode}")
    return ThroughputProfile(
        prefill_tokens_per_s=profile.prefill_tokens_per_s / prefill,
        decode=[
            DecodePoint(running=p.running, tokens_per_s=p.tokens_per_s / decode)
            for p in profile.decode
        ],
    )


def level_factors(samples: Measurements, reference: Measurements, t1: float) -> tuple[float, float]:
    """(prefill, decode) slow-down (> 1: slower) of `samples` against `reference`.

    `samples` re-times the `reference` requests (`measure`: the same prompt
    sizes and running counts) at another moment: the machine's single-thread
    speed drifts by tens of percent within a run, and a replay is emulated at
    the level its own moment measured. Like with like: decode is the median
    over the samples of their time per token over the reference's median at
    the same running count (not over the profile's t(k), which the profile's
    rules may have moved off the measurement); prefill, of their net prompt
    time T - d t(1) over the reference's T - t(1) at the same prompt size
    (the profile's TTFT of a prompt alone is n / rate + t(1), scaled
    p n / rate + d t(1)). Medians: one slow repeat does not move the level.
    """
    ref_decode = dict(zip(*_central(reference.decode), strict=True)) if reference.decode else {}
    ref_prefill = dict(zip(*_central(reference.prefill), strict=True)) if reference.prefill else {}
    decode_ratios = [t / ref_decode[k] for k, t in samples.decode if k in ref_decode]
    if not decode_ratios or not any(n in ref_prefill for n, _ in samples.prefill):
        raise ValueError(
            "re-timing needs decode and prefill samples at the reference's counts and sizes"
        )
    if any(ref_prefill[n] <= t1 for n in ref_prefill):
        raise ValueError(f"the reference's prompts do not outlast a decode step of {t1:.4f} s")
    decode = float(np.median(decode_ratios))
    prefill = float(
        np.median(
            [
                (t - decode * t1) / (ref_prefill[n] - t1)
                for n, t in samples.prefill
                if n in ref_prefill
            ]
        )
    )
    if not prefill > 0:
        raise ValueError(
            f"re-timed prompts do not outlast a decode step: prefill x{prefill:.3f}, "
            f"decode x{decode:.3f}"
        )
    return prefill, decode


# -- error statistics -----------------------------------------------------------------


@dataclass(frozen=True)
class Latency:
    """One request's TTFT, TPOT and end-to-end latency, seconds."""

    ttft: float
    tpot: float
    e2e: float


def _pairs(
    measured: Sequence[Latency], predicted: Sequence[Latency], metric: str
) -> tuple[np.ndarray, np.ndarray]:
    if len(measured) != len(predicted):
        raise ValueError("measured and predicted must pair request by request")
    pairs = [
        (getattr(a, metric), getattr(b, metric)) for a, b in zip(measured, predicted, strict=True)
    ]
    kept = [(a, b) for a, b in pairs if a > 0]
    return np.array([a for a, _ in kept]), np.array([b for _, b in kept])


def relative_errors(
    measured: Sequence[Latency], predicted: Sequence[Latency]
) -> dict[str, np.ndarray]:
    """|predicted - measured| / measured per metric, over requests (TPOT: those of 2+ tokens)."""
    out: dict[str, np.ndarray] = {}
    for m in METRICS:
        a, b = _pairs(measured, predicted, m)
        out[m] = np.abs(b - a) / a
    return out


@dataclass(frozen=True)
class ErrorRow:
    metric: str
    requests: int
    median: float
    p90: float
    measured_median_s: float
    predicted_median_s: float

    @property
    def meets_target(self) -> bool:
        return self.median <= TARGET_MEDIAN and self.p90 <= TARGET_P90


def error_summary(measured: Sequence[Latency], predicted: Sequence[Latency]) -> list[ErrorRow]:
    """Median and P90 relative error per metric, with the medians of both sides."""
    rows = []
    for m in METRICS:
        a, b = _pairs(measured, predicted, m)
        if not len(a):
            raise ValueError(f"no request has a positive measured {m}")
        e = np.abs(b - a) / a
        rows.append(
            ErrorRow(
                metric=m,
                requests=len(e),
                median=float(np.median(e)),
                p90=float(np.quantile(e, 0.9)),
                measured_median_s=float(np.median(a)),
                predicted_median_s=float(np.median(b)),
            )
        )
    return rows


def markdown_table(rows: Sequence[ErrorRow]) -> str:
    """The comparison as a markdown table (milliseconds and percent)."""
    lines = [
        "| metric | requests | measured median (ms) | emulated median (ms) "
        "| median rel. error | P90 rel. error | target (15% / 30%) |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.metric.upper()} | {r.requests} | {r.measured_median_s * 1e3:.1f} "
            f"| {r.predicted_median_s * 1e3:.1f} | {r.median:.1%} | {r.p90:.1%} "
            f"| {'met' if r.meets_target else 'missed'} |"
        )
    return "\n".join(lines) + "\n"


# -- the emulator side ----------------------------------------------------------------


def emulate(
    trace: Sequence[TraceRequest],
    profile: ThroughputProfile,
    kv_capacity_tokens: int,
    max_running: int,
    *,
    mixed: bool = mixed_batches("llama.cpp"),
) -> list[Latency]:
    """Each trace request's latencies as `BatchingEngine` predicts them, in trace order.

    `mixed`: running sequences decode in a new prompt's batch, as llama-server does.
    """
    reqs = emulate_requests(trace, profile, kv_capacity_tokens, max_running, mixed=mixed)
    return [Latency(r.ttft_s, r.tpot_s, r.e2e_s) for r in reqs]


def emulate_requests(
    trace: Sequence[TraceRequest],
    profile: ThroughputProfile,
    kv_capacity_tokens: int,
    max_running: int,
    *,
    mixed: bool = mixed_batches("llama.cpp"),
) -> list[TokenRequest]:
    """The trace run through `BatchingEngine`: its served requests, in trace order."""
    engine = BatchingEngine(profile, kv_capacity_tokens, max_running, mixed=mixed)
    reqs = [TokenRequest(r.rid, r.arrival_s, r.input_tokens, r.output_tokens) for r in trace]
    for req in sorted(reqs, key=lambda q: q.arrival_s):
        engine.advance(req.arrival_s)
        engine.submit(req, req.arrival_s)
    while (t := engine.next_event_time()) is not None:
        engine.advance(t)
    return reqs


def emulated_stages(req: TokenRequest) -> Stages:
    """An emulated request's wait (for admission), prefill and decode."""
    return Stages(
        send=0.0,
        wait=req.admitted_s - req.arrival_s,
        prefill=req.first_token_s - req.admitted_s,
        decode=req.finish_s - req.first_token_s,
    )


# -- the real side ----------------------------------------------------------------------


def _latency(c: Completion, arrival: float) -> Latency:
    tpot = (c.last_s - c.first_s) / (c.tokens - 1) if c.tokens > 1 else 0.0
    return Latency(c.first_s - arrival, tpot, c.last_s - arrival)


@dataclass(frozen=True)
class Stages:
    """Where one request's time went, seconds from its planned arrival.

    `send`: the client's lag behind the plan; `wait`: sent to admitted (a slot
    free and the iteration under way over; llama-server sends the response
    headers then); `prefill`: admitted to the first token; `decode`: first to
    last token. The emulator's stages have `send` 0. `server_prefill` and
    `server_decode` are the server's own `timings` (0 for the emulator).
    """

    send: float
    wait: float
    prefill: float
    decode: float
    server_prefill: float = 0.0
    server_decode: float = 0.0


def measured_stages(c: Completion) -> Stages:
    return Stages(
        send=c.sent_s - c.planned_s,
        wait=c.admitted_s - c.sent_s,
        prefill=c.first_s - c.admitted_s,
        decode=c.last_s - c.first_s,
        server_prefill=c.server_prompt_s,
        server_decode=c.server_decode_s,
    )


def stage_table(
    trace: Sequence[TraceRequest], measured: Sequence[Stages], emulated: Sequence[Stages]
) -> str:
    """Per request, measured / emulated stages (ms) as a markdown table: where the time went."""
    lines = [
        "| request | arrival (s) | in | out | send lag | wait: measured / emulated "
        "| prefill: measured (server) / emulated | decode: measured (server) / emulated |",
        "|---:|---:|---:|---:|---:|---|---|---|",
    ]
    for r, m, e in zip(trace, measured, emulated, strict=True):
        lines.append(
            f"| {r.rid} | {r.arrival_s:.2f} | {r.input_tokens} | {r.output_tokens} "
            f"| {m.send * 1e3:.1f} | {m.wait * 1e3:.0f} / {e.wait * 1e3:.0f} "
            f"| {m.prefill * 1e3:.0f} ({m.server_prefill * 1e3:.0f}) / {e.prefill * 1e3:.0f} "
            f"| {m.decode * 1e3:.0f} ({m.server_decode * 1e3:.0f}) / {e.decode * 1e3:.0f} |"
        )
    return "\n".join(lines) + "\n"


def _prompt(rng: np.random.Generator, vocab: Sequence[int], n: int) -> list[int]:
    return [int(t) for t in rng.choice(vocab, size=n)]


@dataclass
class Measurements:
    """What the calibration measured on the server."""

    prefill: list[tuple[int, float]] = field(default_factory=list)  # (tokens, client TTFT s)
    server_prefill_s: list[tuple[int, float]] = field(default_factory=list)  # (tokens, server s)
    decode: list[tuple[int, float]] = field(default_factory=list)  # (running, s per token)
    sustained: list[dict[str, float]] = field(default_factory=list)  # the burst's latencies


def measure(
    server: LlamaServer,
    vocab: Sequence[int],
    prefill_sizes: Sequence[int],
    running: Sequence[int],
    *,
    decode_tokens: int = 48,
    repeats: int = 3,
    seed: int = 0,
) -> Measurements:
    """Prefill TTFT at `prefill_sizes` (alone) and decode time per token at `running` counts."""
    rng = np.random.default_rng(seed)
    m = Measurements()
    server.complete(_prompt(rng, vocab, 16), 4)  # warm-up: first-request costs are not a rate
    for _ in range(repeats):
        for n in prefill_sizes:
            c = server.complete(_prompt(rng, vocab, n), 1)
            m.prefill.append((c.prompt_tokens, c.first_s - c.sent_s))
            m.server_prefill_s.append((c.prompt_tokens, c.server_prompt_s))
        for k in running:
            calls = [Call(0.0, _prompt(rng, vocab, 8), decode_tokens) for _ in range(k)]
            for c in server.run(calls):
                m.decode.append((k, (c.last_s - c.first_s) / (c.tokens - 1)))
    return m


#: A sustained burst has this many requests per slot of the server.
SUSTAINED_FACTOR = 6
#: Seconds between a burst's requests: far below their service time, so the
#: server stays saturated, but enough that they reach it in order (sent at the
#: same instant, the threads' race decides which are queued first, and each
#: request's latency could not be paired with the emulator's).
SUSTAINED_GAP_S = 0.1


def sustained_burst(spec: TraceSpec, context_tokens: int, parallel: int) -> list[TraceRequest]:
    """`SUSTAINED_FACTOR` x `parallel` requests of the trace's lengths, `SUSTAINED_GAP_S`
    apart, from their own seed."""
    burst = TraceSpec(
        **{**asdict(spec), "requests": SUSTAINED_FACTOR * parallel, "seed": spec.seed + 10_007}
    )
    return [
        TraceRequest(r.rid, r.rid * SUSTAINED_GAP_S, r.input_tokens, r.output_tokens)
        for r in make_trace(burst, context_tokens, 1.0)
    ]


def replay(
    server: LlamaServer, vocab: Sequence[int], trace: Sequence[TraceRequest]
) -> list[Completion]:
    """Each trace request sent at its arrival time, streamed; completions in trace order."""
    rng = np.random.default_rng(len(trace) + sum(r.input_tokens for r in trace))
    calls = [Call(r.arrival_s, _prompt(rng, vocab, r.input_tokens), r.output_tokens) for r in trace]
    done = server.run(calls)
    for r, c in zip(trace, done, strict=True):
        if c.tokens != r.output_tokens or c.prompt_tokens != r.input_tokens:
            raise RuntimeError(
                f"request {r.rid}: the server ran {c.prompt_tokens}/{c.tokens} tokens, "
                f"the trace asked {r.input_tokens}/{r.output_tokens}"
            )
    return done


def latencies(done: Sequence[Completion]) -> list[Latency]:
    """Each request's latencies from its planned arrival (the emulator's arrival)."""
    return [_latency(c, c.planned_s) for c in done]


# -- the whole calibration --------------------------------------------------------------

#: Repeats of the isolated requests re-timed right before each replay (`level_factors`).
RETIME_REPEATS = 2

#: The replays' loads: an ON period offers this times what the calibrated engine
#: serves at full batch. Below saturation the latencies are the engine's speed
#: (queues stay short); above it, a queue grows in each burst and a small speed
#: error grows with it.
LOADS = (0.5, 1.3)


@dataclass
class Replay:
    """One trace replayed on the server and in the emulator, with its error table."""

    load: float
    rate_on: float
    trace: list[TraceRequest]
    measured: list[Latency]
    predicted: list[Latency]
    measured_stages: list[Stages]
    emulated_stages: list[Stages]
    rows: list[ErrorRow]
    #: (prefill, decode) slow-down of the isolated fit the emulator ran with
    #: (`level_factors` of the re-timing just before; (1, 1): the isolated fit)
    level: tuple[float, float] = (1.0, 1.0)

    def to_json(self) -> dict[str, Any]:
        return {
            "load": self.load,
            "rate_on": self.rate_on,
            "level": {"prefill": self.level[0], "decode": self.level[1]},
            "errors": [{**asdict(r), "meets_target": r.meets_target} for r in self.rows],
            "requests": [
                {
                    **asdict(t),
                    "measured": asdict(m),
                    "emulated": asdict(p),
                    "measured_stages": asdict(ms),
                    "emulated_stages": asdict(es),
                }
                for t, m, p, ms, es in zip(
                    self.trace,
                    self.measured,
                    self.predicted,
                    self.measured_stages,
                    self.emulated_stages,
                    strict=True,
                )
            ],
        }


def compare(
    trace: Sequence[TraceRequest],
    done: Sequence[Completion],
    profile: ThroughputProfile,
    kv_capacity_tokens: int,
    max_running: int,
    load: float,
    rate_on: float,
    level: tuple[float, float] = (1.0, 1.0),
) -> Replay:
    """The served trace against the emulator with `profile` scaled by `level` (`scaled`):
    latencies, stages and the error table."""
    measured = latencies(done)
    reqs = emulate_requests(trace, scaled(profile, *level), kv_capacity_tokens, max_running)
    predicted = [Latency(r.ttft_s, r.tpot_s, r.e2e_s) for r in reqs]
    return Replay(
        load=load,
        rate_on=rate_on,
        trace=list(trace),
        measured=measured,
        predicted=predicted,
        measured_stages=[measured_stages(c) for c in done],
        emulated_stages=[emulated_stages(r) for r in reqs],
        rows=error_summary(measured, predicted),
        level=level,
    )


@dataclass
class CalibrationResult:
    tokens: TokenProfile
    measurements: Measurements
    iteration_s: list[float]  # t(k), k = 1 .. parallel
    clock: ClockKind
    burst: Replay  # the sustained burst, a check at saturation (emulated with the isolated fit)
    replays: list[Replay]
    retimings: list[Measurements]  # the re-timing before each replay, in order

    def engine_yaml(self) -> str:
        """The `spec.engine` snippet (camelCase, as in a manifest)."""
        spec = EngineSpec(kind="llama.cpp", tokens=self.tokens)
        body = {"engine": spec.model_dump(by_alias=True, exclude_none=True, mode="json")}
        return (
            "# lmedge calibrate --engine llama.cpp: measured on this machine's CPU.\n"
            "# The schema needs a GPU entry: the '*' entry repeats the CPU measurement;\n"
            "# replace it with a measurement on the GPU the service runs on.\n"
            + yaml.safe_dump(body, sort_keys=False)
        )

    def markdown(self) -> str:
        """Each replay's error table, then where the burst's time went."""
        times = ", ".join(f"{k}: {t * 1e3:.1f}" for k, t in enumerate(self.iteration_s, start=1))
        parts = [f"Clock: {self.clock}. Decode iteration (running: ms): {times}.\n"]
        for r in self.replays:
            parts.append(
                f"\n## Replay at {r.load:g}x capacity in ON periods "
                f"({len(r.trace)} requests, {r.rate_on:.2f}/s)\n\n"
                f"Re-timed just before: prefill x{r.level[0]:.2f}, decode x{r.level[1]:.2f} "
                "of the isolated fit.\n\n" + markdown_table(r.rows)
            )
        parts.append(
            f"\n## Where the sustained burst's time went ({len(self.burst.trace)} requests)\n\n"
            + markdown_table(self.burst.rows)
            + "\n"
            + stage_table(self.burst.trace, self.burst.measured_stages, self.burst.emulated_stages)
        )
        return "".join(parts)

    def to_json(self) -> dict[str, Any]:
        return {
            "clock": self.clock,
            "tokens": self.tokens.model_dump(by_alias=True, exclude_none=True, mode="json"),
            "iteration_s": self.iteration_s,
            "measurements": asdict(self.measurements),
            "burst": self.burst.to_json(),
            "replays": [
                {**r.to_json(), "retiming": asdict(m)}
                for r, m in zip(self.replays, self.retimings, strict=True)
            ],
        }


def calibrate(
    binary: Path,
    model: Path,
    config: ServerConfig,
    trace_spec: TraceSpec,
    log_path: Path,
    port: int,
    *,
    loads: Sequence[float] = LOADS,
    clock: ClockKind = "cpu",
    repeats: int = 4,
    decode_tokens: int = 32,
    on_phase: Callable[[str], None] = lambda _: None,
) -> CalibrationResult:
    """Measure, fit the profile, replay the trace at each load on the server and in the emulator."""
    # The lengths do not depend on the rate: the prefill sizes come from a draft.
    draft = make_trace(trace_spec, config.slot_context, 1.0)
    inputs = np.array([r.input_tokens for r in draft])
    sizes = sorted({int(np.quantile(inputs, q)) for q in (0.1, 0.3, 0.5, 0.7, 0.9)})
    running = decode_counts(config.parallel)
    kv_tokens = config.parallel * config.slot_context
    replays: list[Replay] = []
    retimings: list[Measurements] = []
    with running_llama_server(binary, model, config, log_path, port, clock) as server:
        vocab = server.vocabulary()
        on_phase(f"measuring prefill at {sizes} tokens and decode at {running} sequences")
        m = measure(server, vocab, sizes, running, decode_tokens=decode_tokens, repeats=repeats)
        iteration_s = fit_iteration_times(m.decode, config.parallel)
        isolated = ThroughputProfile(
            prefill_tokens_per_s=fit_prefill_rate(m.prefill, iteration_s[0]),
            decode=decode_curve(iteration_s),
        )
        burst = sustained_burst(trace_spec, config.slot_context, config.parallel)
        on_phase(f"timing a sustained burst of {len(burst)} requests")
        burst_done = replay(server, vocab, burst)
        m.sustained = [asdict(lat) for lat in latencies(burst_done)]
        burst_replay = compare(burst, burst_done, isolated, kv_tokens, config.parallel, 0.0, 0.0)
        for i, load in enumerate(loads, start=1):
            spec = TraceSpec(**{**asdict(trace_spec), "burst_load": load})
            rate_on = load * capacity_per_s(isolated, config.parallel, spec)
            trace = make_trace(spec, config.slot_context, rate_on)
            on_phase(f"re-timing the isolated requests ({RETIME_REPEATS} repeats)")
            retimed = measure(
                server,
                vocab,
                sizes,
                running,
                decode_tokens=decode_tokens,
                repeats=RETIME_REPEATS,
                seed=i,
            )
            level = level_factors(retimed, m, iteration_s[0])
            on_phase(
                f"replaying {len(trace)} requests at {load:g}x capacity "
                f"(ON periods at {rate_on:.2f} requests/s, {trace[-1].arrival_s:.0f} s; "
                f"level: prefill x{level[0]:.2f}, decode x{level[1]:.2f})"
            )
            done = replay(server, vocab, trace)
            retimings.append(retimed)
            replays.append(
                compare(trace, done, isolated, kv_tokens, config.parallel, load, rate_on, level)
            )
    tokens = TokenProfile(
        weights_gib=round(model.stat().st_size / GIB, 3),
        kv_bytes_per_token=kv_bytes_per_token(model),
        context_tokens=config.slot_context,
        max_running_sequences=config.parallel,
        gpus=[GpuThroughputProfile(gpu_model=ANY_GPU, **isolated.model_dump())],
        cpu=isolated,
    )
    return CalibrationResult(tokens, m, iteration_s, clock, burst_replay, replays, retimings)


def write_result(result: CalibrationResult, out_dir: Path) -> list[Path]:
    """engine.yaml (the profile), comparison.json and comparison.md under `out_dir`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / "engine.yaml", out_dir / "comparison.json", out_dir / "comparison.md"]
    paths[0].write_text(result.engine_yaml())
    paths[1].write_text(json.dumps(result.to_json(), indent=2) + "\n")
    paths[2].write_text(result.markdown())
    return paths
