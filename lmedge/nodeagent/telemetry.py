"""Node telemetry: CPU, memory, GPU and vRAM use, as `NodeTelemetry` snapshots.

Two sources (paper §V-D1):

* the exporters themselves: node-exporter (`:9100/metrics`) and dcgm-exporter
  (`:9400/metrics`) of every node, scraped concurrently with httpx and parsed
  with prometheus_client's exposition-format parser;
* a Prometheus server that already scrapes them, queried with
  prometheus-api-client, when one is configured.

The token engines' own pages (llama.cpp server, vLLM) are read by
`EngineScraper` from each engine pod's `/metrics` (parsed by
`lmedge.nodeagent.engines`), and a llama.cpp pod's `/slots` when its page
has no KV gauge, and put into the node's snapshot as `engines`.

CPU utilisation comes from the `node_cpu_seconds_total` counters: the busy
share of the CPU seconds elapsed since the previous scrape of the node, or
since boot on the first scrape. Memory utilisation is `1 - MemAvailable /
MemTotal`; GPU utilisation is `DCGM_FI_DEV_GPU_UTIL / 100` per GPU, and vRAM
`DCGM_FI_DEV_FB_USED` (MiB) in GiB. A node without a dcgm-exporter (a CPU-only
node) has empty GPU lists. An exporter that does not answer yields no snapshot
for that node and a logged warning: a telemetry gap must not stop the loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx

from lmedge.api import ClusterContext
from lmedge.api.engine_telemetry import EngineCounters, EngineTelemetry, engine_telemetry
from lmedge.api.engines import TOKEN_ENGINES
from lmedge.api.records import NodeTelemetry
from lmedge.backends.kubernetes.pods import MODEL_PORT, ObservedPod
from lmedge.nodeagent.engines import engine_counters, slots_url
from lmedge.nodeagent.exposition import Samples, parse_exposition

__all__ = [
    "EngineScraper",
    "EngineTarget",
    "ExporterTargets",
    "PrometheusTelemetry",
    "TelemetryCollector",
    "TelemetrySink",
    "parse_exposition",
]

log = logging.getLogger(__name__)

_MIB_PER_GIB = 1024.0


def _cpu_totals(samples: Samples) -> tuple[float, float] | None:
    """(idle + iowait seconds, all seconds) summed over CPUs, or None if absent."""
    rows = samples.get("node_cpu_seconds_total")
    if not rows:
        return None
    total = sum(v for _, v in rows)
    idle = sum(v for labels, v in rows if labels.get("mode") in ("idle", "iowait"))
    return idle, total


def _one(samples: Samples, name: str) -> float | None:
    rows = samples.get(name)
    return rows[0][1] if rows else None


def _per_gpu(samples: Samples, name: str) -> dict[int, float]:
    return {
        int(labels.get("gpu", i)): value for i, (labels, value) in enumerate(samples.get(name, []))
    }


def _clamp(x: float) -> float:
    return min(max(x, 0.0), 1.0)


@dataclass(frozen=True)
class ExporterTargets:
    """Where one node's exporters answer; `dcgm_url` is None on a CPU-only node."""

    node: str
    node_url: str
    dcgm_url: str | None = None

    @classmethod
    def for_host(cls, node: str, host: str, *, gpu: bool) -> ExporterTargets:
        """The default ports: node-exporter 9100, dcgm-exporter 9400."""
        return cls(
            node=node,
            node_url=f"http://{host}:9100/metrics",
            dcgm_url=f"http://{host}:9400/metrics" if gpu else None,
        )


class TelemetrySink(Protocol):
    """Where snapshots go: `lmedge.store.Store` has this method."""

    def record_telemetry(self, snapshots: Iterable[NodeTelemetry]) -> None: ...


@dataclass
class TelemetryCollector:
    """Scrapes the exporters of many nodes concurrently.

    `timeout_s`: per scrape, seconds (default 5: a slot is 30 s, and a slow
    exporter must not delay the snapshot of the others). `clock` gives
    `time_s` on the run clock (wall seconds by default).
    """

    targets: Sequence[ExporterTargets]
    run: str = ""
    timeout_s: float = 5.0
    clock: Callable[[], float] = time.time
    transport: httpx.AsyncBaseTransport | None = None
    _previous_cpu: dict[str, tuple[float, float]] = field(default_factory=dict)

    async def collect(
        self, engines: Mapping[str, list[EngineTelemetry]] | None = None
    ) -> list[NodeTelemetry]:
        """One snapshot per node whose node-exporter answered.

        `engines`: node -> its engine pods' telemetry (`EngineScraper`), put
        into that node's snapshot; a node without an entry gets None.
        """
        async with httpx.AsyncClient(timeout=self.timeout_s, transport=self.transport) as client:
            results = await asyncio.gather(*(self._node(client, t) for t in self.targets))
        snapshots = [r for r in results if r is not None]
        for s in snapshots:
            s.engines = (engines or {}).get(s.node)
        return snapshots

    async def collect_into(
        self,
        sink: TelemetrySink,
        engines: Mapping[str, list[EngineTelemetry]] | None = None,
    ) -> list[NodeTelemetry]:
        """Collect (with `engines`, as `collect`) and store the snapshots; return them."""
        snapshots = await self.collect(engines)
        if snapshots:
            await asyncio.to_thread(sink.record_telemetry, snapshots)
        return snapshots

    async def _node(
        self, client: httpx.AsyncClient, target: ExporterTargets
    ) -> NodeTelemetry | None:
        urls = [target.node_url] + ([target.dcgm_url] if target.dcgm_url else [])
        texts = await asyncio.gather(*(_get(client, u) for u in urls))
        node_text = texts[0]
        if node_text is None:
            return None
        gpu_text = texts[1] if len(texts) > 1 else None
        return self.snapshot(
            target.node,
            parse_exposition(node_text),
            parse_exposition(gpu_text) if gpu_text is not None else {},
        )

    def snapshot(self, node: str, host: Samples, gpus: Samples) -> NodeTelemetry:
        """A snapshot from parsed exporter samples (updates the CPU baseline)."""
        cpu = 0.0
        totals = _cpu_totals(host)
        if totals is not None:
            idle, total = totals
            before = self._previous_cpu.get(node)
            if before is not None and total > before[1]:
                idle, total = idle - before[0], total - before[1]
            cpu = _clamp(1.0 - idle / total) if total > 0 else 0.0
            self._previous_cpu[node] = totals
        available = _one(host, "node_memory_MemAvailable_bytes")
        mem_total = _one(host, "node_memory_MemTotal_bytes")
        memory = _clamp(1.0 - available / mem_total) if available is not None and mem_total else 0.0
        util = _per_gpu(gpus, "DCGM_FI_DEV_GPU_UTIL")
        used = _per_gpu(gpus, "DCGM_FI_DEV_FB_USED")
        extra: dict[str, float] = {}
        for name, key in (("node_load1", "load1"), ("node_memory_MemTotal_bytes", "memory_bytes")):
            value = _one(host, name)
            if value is not None:
                extra[key] = value
        for gpu, watts in sorted(_per_gpu(gpus, "DCGM_FI_DEV_POWER_USAGE").items()):
            extra[f"gpu{gpu}_power_w"] = watts
        for gpu, free in sorted(_per_gpu(gpus, "DCGM_FI_DEV_FB_FREE").items()):
            extra[f"gpu{gpu}_vram_free_gib"] = free / _MIB_PER_GIB
        return NodeTelemetry(
            run=self.run,
            node=node,
            time_s=max(self.clock(), 0.0),
            cpu_util=cpu,
            memory_util=memory,
            gpu_util=[_clamp(util[g] / 100.0) for g in sorted(util)],
            vram_used_gib=[used[g] / _MIB_PER_GIB for g in sorted(used)],
            source="exporter",
            extra=extra,
        )


async def _get(client: httpx.AsyncClient, url: str) -> str | None:
    try:
        response = await client.get(url)
        response.raise_for_status()
    except httpx.HTTPError as exc:
        log.warning("telemetry: %s did not answer: %s", url, exc)
        return None
    return response.text


@dataclass(frozen=True)
class EngineTarget:
    """One model pod's metrics page: `url` is `http://<pod IP>:<port>/metrics`."""

    lm: str
    pod: str
    url: str


def engine_targets(ctx: ClusterContext, pods: Iterable[ObservedPod]) -> list[EngineTarget]:
    """The metrics pages of the Ready pods of a llama.cpp or vLLM LMService among `pods`,
    by pod name. A pipeline pod's /metrics counts prompts, which the gateway reports."""
    return [
        EngineTarget(lm=p.lm, pod=p.name, url=f"http://{p.ip}:{MODEL_PORT}/metrics")
        for p in sorted(pods, key=lambda p: p.name)
        if p.ready
        and not p.deleting
        and p.ip
        and ctx.has_service(p.lm)
        and ctx.service(p.lm).spec.engine.kind in TOKEN_ENGINES
    ]


@dataclass
class EngineScraper:
    """Reads the token engines' `/metrics` of model pods, slot after slot: a node agent's
    of its node's, the controller's of every node's (its snapshot's `NodeState.engines`).

    Keeps each pod's previous reading, so throughput is over the interval
    between two scrapes (`lmedge.api.engine_telemetry.engine_telemetry`).
    A pod that does not answer, or whose page is malformed, is left out with
    a logged warning; a pipeline pod's page (no engine prefix) is left out
    silently. A llama.cpp pod whose `/slots` does not answer is read without
    its KV usage. `timeout_s`: per page, seconds (default 2: the agent scrapes
    before it decides, and a slot is 30 s).

    At most `concurrency` pages are read at once (one connection each; a
    llama.cpp pod's `/slots` reuses its `/metrics` connection), so the
    controller reading every pod of a 1,000-worker cluster neither opens a
    thousand sockets at once nor counts the wait for a free connection as a
    pod's silence. `budget_s` (None: no bound) bounds the whole read: pages
    not in by then are left out, said in one warning.
    """

    timeout_s: float = 2.0
    clock: Callable[[], float] = time.time
    transport: httpx.AsyncBaseTransport | None = None
    concurrency: int = 32
    budget_s: float | None = None
    _previous: dict[str, EngineCounters] = field(default_factory=dict)

    async def _slots(
        self,
        client: httpx.AsyncClient,
        targets: Sequence[EngineTarget],
        texts: Sequence[str | None],
        deadline: float | None,
    ) -> dict[str, str]:
        """The `/slots` JSON of the pods whose page has no KV gauge (llama.cpp), by pod."""
        urls: dict[str, str] = {}
        for target, text in zip(targets, texts, strict=True):
            try:
                url = slots_url(text, target.url) if text is not None else None
            except ValueError:
                continue  # engine_counters says what is wrong with the page
            if url is not None:
                urls[target.pod] = url
        pages = await self._pages(client, list(urls.values()), deadline)
        return {pod: page for pod, page in zip(urls, pages, strict=True) if page is not None}

    async def _pages(
        self, client: httpx.AsyncClient, urls: Sequence[str], deadline: float | None
    ) -> list[str | None]:
        """The pages at `urls` (None: not read), those not in by `deadline` left out."""
        if not urls:
            return []
        # Bounded here, not only by the client's pool: httpx's pool scans every
        # queued request at each connection it frees, so 1,000 queued requests
        # cost seconds of CPU a slot.
        gate = asyncio.Semaphore(self.concurrency)

        async def get(url: str) -> str | None:
            async with gate:
                return await _get(client, url)

        tasks = [asyncio.ensure_future(get(url)) for url in urls]
        left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
        _, late = await asyncio.wait(tasks, timeout=left)
        for task in late:
            task.cancel()
        if late:
            await asyncio.wait(late)
            log.warning(
                "telemetry: %d of %d engine pages not read within %.1f s (e.g. %s)",
                len(late),
                len(urls),
                self.budget_s or 0.0,
                urls[tasks.index(next(iter(late)))],
            )
        return [None if t.cancelled() else t.result() for t in tasks]

    def read(
        self, ctx: ClusterContext, pods: Iterable[ObservedPod]
    ) -> list[EngineTelemetry] | None:
        """The telemetry of the token-engine pods among `pods` (`engine_targets`); None
        when there is none. Never raises: a bug in reading a page only logs."""
        return self.read_targets(engine_targets(ctx, pods))

    def read_targets(self, targets: Sequence[EngineTarget]) -> list[EngineTelemetry] | None:
        """`read` of these pages. Never raises."""
        try:
            return asyncio.run(self.scrape(targets))
        except Exception:
            log.exception("engine telemetry not read")
            return None

    async def scrape(self, targets: Sequence[EngineTarget]) -> list[EngineTelemetry] | None:
        """The telemetry of the engine pods among `targets`; None when there is none."""
        texts: list[str | None] = []
        slots: dict[str, str] = {}
        if targets:
            deadline = None if self.budget_s is None else time.monotonic() + self.budget_s
            async with httpx.AsyncClient(
                # The wait for one of the `concurrency` connections is not a page's.
                timeout=httpx.Timeout(self.timeout_s, pool=None),
                limits=httpx.Limits(
                    max_connections=self.concurrency, max_keepalive_connections=self.concurrency
                ),
                transport=self.transport,
            ) as client:
                texts = await self._pages(client, [t.url for t in targets], deadline)
                slots = await self._slots(client, targets, texts, deadline)
        now = max(self.clock(), 0.0)
        out: list[EngineTelemetry] = []
        seen: dict[str, EngineCounters] = {}
        for target, text in zip(targets, texts, strict=True):
            if text is None:
                continue
            try:
                counters = engine_counters(
                    text, target.lm, pod=target.pod, time_s=now, slots=slots.get(target.pod)
                )
            except ValueError as exc:
                log.warning(
                    "telemetry: %s (%s): unreadable metrics: %s", target.pod, target.url, exc
                )
                continue
            if counters is None:
                continue
            out.append(engine_telemetry(counters, self._previous.get(target.pod)))
            seen[target.pod] = counters
        self._previous = seen  # a pod that is gone (or silent) starts afresh
        return out or None


#: PromQL per quantity; `instance` (node-exporter) / `Hostname` (dcgm) name the node.
_QUERIES = {
    "cpu": '1 - avg by (instance) (rate(node_cpu_seconds_total{mode=~"idle|iowait"}[1m]))',
    "memory": "1 - node_memory_MemAvailable_bytes / node_memory_MemTotal_bytes",
    "gpu": "DCGM_FI_DEV_GPU_UTIL",
    "vram": "DCGM_FI_DEV_FB_USED",
}


@dataclass
class PrometheusTelemetry:
    """Snapshots from a Prometheus server that scrapes the exporters.

    `instances`: node name -> the `instance` label of its node-exporter
    (e.g. `10.0.0.3:9100`); GPU series are matched on dcgm-exporter's
    `Hostname` label, which is the node name. Queries run in a thread (the
    client is synchronous).
    """

    url: str
    instances: dict[str, str]
    run: str = ""
    clock: Callable[[], float] = time.time
    timeout_s: float = 5.0

    async def collect(self) -> list[NodeTelemetry]:
        return await asyncio.to_thread(self._collect)

    def _collect(self) -> list[NodeTelemetry]:
        from prometheus_api_client import PrometheusConnect

        prom = PrometheusConnect(url=self.url, disable_ssl=True, timeout=self.timeout_s)
        answers = {key: prom.custom_query(query) for key, query in _QUERIES.items()}
        by_instance = {inst: node for node, inst in self.instances.items()}
        cpu = _by_node(answers["cpu"], "instance", by_instance)
        memory = _by_node(answers["memory"], "instance", by_instance)
        gpu = _by_node_gpu(answers["gpu"])
        vram = _by_node_gpu(answers["vram"])
        now = max(self.clock(), 0.0)
        return [
            NodeTelemetry(
                run=self.run,
                node=node,
                time_s=now,
                cpu_util=_clamp(cpu.get(node, 0.0)),
                memory_util=_clamp(memory.get(node, 0.0)),
                gpu_util=[_clamp(v / 100.0) for _, v in sorted(gpu.get(node, {}).items())],
                vram_used_gib=[v / _MIB_PER_GIB for _, v in sorted(vram.get(node, {}).items())],
                source="prometheus",
            )
            for node in self.instances
            if node in cpu or node in memory
        ]


def _by_node(result: list[dict[str, Any]], label: str, nodes: dict[str, str]) -> dict[str, float]:
    out: dict[str, float] = {}
    for series in result:
        node = nodes.get(series.get("metric", {}).get(label, ""))
        if node is not None:
            out[node] = float(series["value"][1])
    return out


def _by_node_gpu(result: list[dict[str, Any]]) -> dict[str, dict[int, float]]:
    out: dict[str, dict[int, float]] = defaultdict(dict)
    for series in result:
        metric = series.get("metric", {})
        if "Hostname" in metric and "gpu" in metric:
            out[metric["Hostname"]][int(metric["gpu"])] = float(series["value"][1])
    return dict(out)
