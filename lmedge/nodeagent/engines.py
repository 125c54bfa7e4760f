"""Engine counters from a token engine's `/metrics` page: llama.cpp server and vLLM.

Each engine names the same five quantities its own way (`ENGINES`); the page
says which engine wrote it by its prefix (`llamacpp:`, `vllm:`), so a node
agent reads a pod without knowing its LMService. A page with neither prefix
(the pipeline model server's, which counts prompts) is no engine page: None.

* llama.cpp server (run with `--metrics`): counters
  `llamacpp:prompt_tokens_total`, `llamacpp:tokens_predicted_total`; gauges
  `llamacpp:requests_processing` (running), `llamacpp:requests_deferred`
  (waiting). `llamacpp:kv_cache_usage_ratio` is read when present: builds
  before the KV cache was unified exported it. Later ones (the one vendored by
  llama-cpp-python 0.3.36, `tools/server/server-task.cpp`, and the
  `llama-server` of `make tools`) do not, and none of their metrics is a KV
  gauge (`llamacpp:n_tokens_max` is the longest sequence seen, a counter).
  Their usage comes from the server's `/slots` page instead
  (`slots_kv_usage`): the tokens the busy slots hold over the context of all
  slots. A server run with `--no-slots` reports no KV usage (None), never a
  made-up 0.
* vLLM: gauges `vllm:kv_cache_usage_perc` (`vllm:gpu_cache_usage_perc` before
  v0.10; a fraction despite the name), `vllm:num_requests_running`,
  `vllm:num_requests_waiting`; counters `vllm:prompt_tokens_total`,
  `vllm:generation_tokens_total`. Series are labelled `model_name` (and
  `engine` with data parallelism): counts are summed over series, KV usage is
  the fullest series'.

Only the lines of those quantities are parsed (a vLLM page is mostly
histograms, which nothing here reads). Malformed lines among them, a missing
quantity or a value out of range are a `ValueError` naming what is wrong:
the collector logs it and leaves the pod out, the node agent goes on.
Fetching the page is `lmedge.nodeagent.telemetry`'s.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from lmedge.api.engine_telemetry import EngineCounters
from lmedge.nodeagent.exposition import Samples, parse_exposition

__all__ = [
    "ENGINES",
    "EngineMetricNames",
    "engine_counters",
    "slots_kv_usage",
    "slots_url",
]


@dataclass(frozen=True)
class EngineMetricNames:
    """The sample names one engine exports the five quantities under.

    `kv_usage`: candidates, first present wins (names changed across versions);
    none present means the engine does not report it on this page.
    `kv_slots`: the path beside `/metrics` where the usage is read when no
    candidate is present (llama.cpp's `/slots`); None: nowhere else.
    """

    prefix: str
    kv_usage: tuple[str, ...]
    running: str
    waiting: str
    prompt_tokens: str
    generation_tokens: str
    kv_slots: str | None = None


ENGINES: dict[str, EngineMetricNames] = {
    "llama.cpp": EngineMetricNames(
        prefix="llamacpp:",
        kv_usage=("llamacpp:kv_cache_usage_ratio",),
        running="llamacpp:requests_processing",
        waiting="llamacpp:requests_deferred",
        prompt_tokens="llamacpp:prompt_tokens_total",
        generation_tokens="llamacpp:tokens_predicted_total",
        kv_slots="/slots",
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


#: The sample names the counters are read from, of every engine.
_READ = frozenset(
    name
    for names in ENGINES.values()
    for name in (
        *names.kv_usage,
        names.running,
        names.waiting,
        names.prompt_tokens,
        names.generation_tokens,
    )
)


def _engine(text: str) -> EngineMetricNames | None:
    """The engine whose samples the page has (by their prefix), or None."""
    for names in ENGINES.values():
        if text.startswith(names.prefix) or f"\n{names.prefix}" in text:
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


def _sample_name(line: str) -> str:
    """The sample name a line of the text format starts with ("" for none)."""
    head = line.split("{", 1)[0].split(None, 1)
    return head[0] if head else ""


def _samples(text: str) -> Samples:
    """The samples of `text` the counters are read from (`_READ`).

    Only their lines are parsed: a vLLM page is mostly histograms (about 40 KB
    and 400 lines), and the controller reads one page per engine pod a slot.
    """
    lines = "\n".join(line for line in text.splitlines() if _sample_name(line) in _READ)
    try:
        return parse_exposition(lines + "\n" if lines else "")
    except ValueError as exc:  # prometheus_client's parser: "Invalid line", bad value, ...
        raise ValueError(f"not the Prometheus text format: {exc}") from exc


def _kv_gauge(samples: Samples, names: EngineMetricNames) -> list[float] | None:
    return next((_values(samples, n) for n in names.kv_usage if samples.get(n)), None)


def slots_url(text: str, metrics_url: str) -> str | None:
    """Where the KV usage of the pod whose `/metrics` page is `text` is read
    instead, when the page has no KV gauge (llama.cpp's `/slots`, beside
    `metrics_url`); None when the page says it or no other page does.

    A `ValueError` when the page is malformed.
    """
    names = _engine(text)
    if names is None or names.kv_slots is None:
        return None
    if _kv_gauge(_samples(text), names) is not None:
        return None
    return metrics_url.removesuffix("/metrics") + names.kv_slots


def _int(slot: dict[str, Any], key: str) -> int:
    value = slot.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"a slot's {key} is {value!r}, not a count")
    return value


def slots_kv_usage(text: str) -> float:
    """A llama-server's KV-cache usage from its `/slots` JSON, 0..1.

    The server splits its context (`--ctx-size`) into one `n_ctx` per slot
    (`--parallel`); a busy slot (`is_processing`) holds `n_prompt_tokens`
    tokens, its prompt and what it has generated so far (the count grows by
    one per decoded token). Usage is the busy slots' tokens over the sum of
    every slot's `n_ctx`. An idle slot's cached conversation is not counted:
    the server overwrites it for the next request, as vLLM counts cached
    blocks no sequence holds as free. A `ValueError` naming what is wrong
    when the page is not that JSON.
    """
    try:
        slots = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"/slots is not JSON: {exc}") from exc
    if not isinstance(slots, list) or not slots or not all(isinstance(s, dict) for s in slots):
        raise ValueError("/slots is not a list of slot objects")
    capacity = sum(_int(s, "n_ctx") for s in slots)
    held = sum(_int(s, "n_prompt_tokens") for s in slots if s.get("is_processing") is True)
    if capacity == 0:
        raise ValueError("/slots: every slot has n_ctx 0")
    return min(held / capacity, 1.0)


def engine_counters(
    text: str, lm: str, *, pod: str, time_s: float, slots: str | None = None
) -> EngineCounters | None:
    """The reading of `pod` (serving `lm`) at `time_s` from its `/metrics` text,
    and its `/slots` JSON (`slots`, read where `slots_url` says) for the KV usage
    of a llama.cpp page without the gauge.

    None when the page is no token engine's; a `ValueError` naming the
    problem when it is malformed or lacks a quantity.
    """
    names = _engine(text)
    if names is None:
        return None
    samples = _samples(text)
    kv = _kv_gauge(samples, names)
    # the fullest series; a rounding excess over 1 is still a full cache
    usage = min(max(kv), 1.0) if kv else None
    if usage is None and slots is not None and names.kv_slots is not None:
        usage = slots_kv_usage(slots)
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
