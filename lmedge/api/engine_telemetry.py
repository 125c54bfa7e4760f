"""Engine telemetry: what a token engine's pod reports about its batch and KV cache.

A token-level engine (llama.cpp server, vLLM; `lmedge.api.engines`) exports
gauges (KV-cache usage, running and waiting sequences) and counters (prompt
and generated tokens). On a cluster the node agent scrapes them from each
engine pod's `/metrics`; in the emulator the token model produces the same
readings. Both hand an `EngineCounters` reading to `engine_telemetry`, so an
agent sees the same `EngineTelemetry` in both worlds.

Throughput is the counters' growth over the interval between two readings
(tokens/s), the way Prometheus' `rate()` reads a counter: a counter that
went down was reset (the pod restarted), and its new value is what it
counted since. The first reading of a pod has no interval: its throughput
is None, not 0.

This module does not parse the exposition format (`lmedge.nodeagent.engines`)
and does not model an engine (`lmedge.sim.tokens`).
"""

from __future__ import annotations

from collections.abc import Sequence
from statistics import fmean

from pydantic import Field

from lmedge.api.base import WireModel

__all__ = ["EngineCounters", "EngineTelemetry", "engine_telemetry", "kv_usage"]


class EngineCounters(WireModel):
    """One reading of one engine pod at `time_s` (run clock, seconds).

    `kv_cache_usage` is None when the engine does not report it (a llama.cpp
    build without the gauge whose `/slots` page is off or did not answer).
    """

    lm: str
    pod: str = ""
    time_s: float = Field(ge=0)
    kv_cache_usage: float | None = Field(default=None, ge=0, le=1)
    running: int = Field(default=0, ge=0)
    waiting: int = Field(default=0, ge=0)
    prompt_tokens_total: float = Field(default=0.0, ge=0)
    generation_tokens_total: float = Field(default=0.0, ge=0)


class EngineTelemetry(WireModel):
    """One token engine pod over the last scrape interval, as the agents and the store see it."""

    lm: str
    pod: str = Field(default="", description="The pod's name; empty in the emulator.")
    kv_cache_usage: float | None = Field(
        default=None, ge=0, le=1, description="Share of the KV-cache pool in use, 0..1."
    )
    running: int = Field(default=0, ge=0, description="Sequences in the running batch.")
    waiting: int = Field(default=0, ge=0, description="Sequences queued for the batch.")
    prompt_tokens_per_s: float | None = Field(
        default=None, ge=0, description="Prompt (prefill) tokens/s; None on a first reading."
    )
    generation_tokens_per_s: float | None = Field(
        default=None, ge=0, description="Generated (decode) tokens/s; None on a first reading."
    )


def _rate(now: float, before: float, dt: float) -> float:
    grown = now - before if now >= before else now  # a reset counter counts from 0 again
    return grown / dt


def engine_telemetry(now: EngineCounters, before: EngineCounters | None) -> EngineTelemetry:
    """The telemetry of `now`'s pod, throughput over the interval since `before`.

    `before` is the previous reading of the same pod (None on the first):
    rates are (growth of the counter) / (now.time_s - before.time_s), None
    when there is no earlier reading or no time passed between the two.
    """
    dt = now.time_s - before.time_s if before is not None else 0.0
    prompt = generation = None
    if before is not None and dt > 0:
        prompt = _rate(now.prompt_tokens_total, before.prompt_tokens_total, dt)
        generation = _rate(now.generation_tokens_total, before.generation_tokens_total, dt)
    return EngineTelemetry(
        lm=now.lm,
        pod=now.pod,
        kv_cache_usage=now.kv_cache_usage,
        running=now.running,
        waiting=now.waiting,
        prompt_tokens_per_s=prompt,
        generation_tokens_per_s=generation,
    )


def kv_usage(engines: Sequence[EngineTelemetry] | None) -> tuple[float, float] | None:
    """(max, mean) KV-cache usage over the engine pods that report it; None when none does."""
    values = [e.kv_cache_usage for e in engines or () if e.kv_cache_usage is not None]
    return (max(values), fmean(values)) if values else None
