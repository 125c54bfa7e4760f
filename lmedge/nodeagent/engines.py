"""Engine counters from a token engine's `/metrics` page: llama.cpp server and vLLM.

Each engine names the same five quantities its own way (`ENGINES`); the page
says which engine wrote it by its prefix (`llamacpp:`, `vllm:`), so a node
agent reads a pod without knowing its LMService. A page with neither prefix
(the pipeline model server's, which counts prompts) is no engine page: None.

* llama.cpp server (run with `--metrics`): counters
  `llamacpp:prompt_tokens_total`, `llamacpp:tokens_predicted_total`; gauges
  `llamacpp:requests_processing` (running), `llamacpp:requests_deferred`
  (waiting). `llamacpp:kv_cache_usage_ratio` is read when present: builds
  before the KV cache was unified exported it, the one vendored by
  llama-cpp-python 0.3.36 (`tools/server/server-task.cpp`) does not, so its
  pods report no KV usage (None), never a made-up 0.
* vLLM: gauges `vllm:kv_cache_usage_perc` (`vllm:gpu_cache_usage_perc` before
  v0.10; a fraction despite the name), `vllm:num_requests_running`,
  `vllm:num_requests_waiting`; counters `vllm:prompt_tokens_total`,
  `vllm:generation_tokens_total`. Series are labelled `model_name` (and
  `engine` with data parallelism): counts are summed over series, KV usage is
  the fullest series'.

Malformed text, a missing quantity or a value out of range is a `ValueError`
naming what is wrong: the collector logs it and leaves the pod out, the node
agent goes on. Fetching the page is `lmedge.nodeagent.telemetry`'s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from lmedge.api.engine_telemetry import EngineCounters
from lmedge.nodeagent.exposition import Samples, parse_exposition

__all__ = ["ENGINES", "EngineMetricNames", "engine_counters"]


@dataclass(frozen=True)
class EngineMetricNames:
    """The sample names one engine exports the five quantities under.

    `kv_usage`: candidates, first present wins (names changed across versions);
    none present means the engine does not report it.
    """

    prefix: str
    kv_usage: tuple[str, ...]
    running: str
    waiting: str
    prompt_tokens: str
    generation_tokens: str


ENGINES: dict[str, EngineMetricNames] = {
    "llama.cpp": EngineMetricNames(
        prefix="llamacpp:",
        kv_usage=("llamacpp:kv_cache_usage_ratio",),
        running="llamacpp:requests_processing",
        waiting="llamacpp:requests_deferred",
        prompt_tokens="llamacpp:prompt_tokens_total",
        generation_tokens="llamacpp:tokens_predicted_total",
    ),
    "vllm": EngineMetricNames(
        prefix="vllm:",
        kv_usage=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
        running="vllm:num_requests_running",
        waiting="vllm:num_requests_waiting",
        prompt_tokens="vllm:prompt_tokens_total",
        generation_tokens="vllm:generation_tokens_total",
    ),
}


def _engine(samples: Samples) -> EngineMetricNames | None:
    for names in ENGINES.values():
        if any(name.startswith(names.prefix) for name in samples):
            return names
    return None


def _values(samples: Samples, name: str) -> list[float]:
    values = [value for _, value in samples.get(name, [])]
    if not all(math.isfinite(v) for v in values):
        raise ValueError(f"{name} is not a finite number")
    return values


def _sum(samples: Samples, name: str) -> float:
    values = _values(samples, name)
    if not values:
        raise ValueError(f"the page has no {name}")
    return sum(values)


def engine_counters(text: str, lm: str, *, pod: str, time_s: float) -> EngineCounters | None:
    """The reading of `pod` (serving `lm`) at `time_s` from its `/metrics` text.

    None when the page is no token engine's; a `ValueError` naming the
    problem when it is malformed or lacks a quantity.
    """
    try:
        samples = parse_exposition(text)
    except ValueError as exc:  # prometheus_client's parser: "Invalid line", bad value, ...
        raise ValueError(f"not the Prometheus text format: {exc}") from exc
    names = _engine(samples)
    if names is None:
        return None
    kv = next((_values(samples, n) for n in names.kv_usage if samples.get(n)), None)
    # the fullest series; a rounding excess over 1 is still a full cache
    usage = min(max(kv), 1.0) if kv else None
    return EngineCounters(
        lm=lm,
        pod=pod,
        time_s=time_s,
        kv_cache_usage=usage,
        running=round(_sum(samples, names.running)),
        waiting=round(_sum(samples, names.waiting)),
        prompt_tokens_total=_sum(samples, names.prompt_tokens),
        generation_tokens_total=_sum(samples, names.generation_tokens),
    )
