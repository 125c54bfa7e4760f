"""Prometheus metrics of the control plane: agents' decisions, the slot clock, store buffers.

The gateways export request metrics (`lmedge.dataplane.metrics`), the model
servers prompt metrics; this module is what the controller and the node
agents export, so an operator can alert on what the agents do:

- `lmedge_agent_decisions_total{agent, source, outcome}`: every decision of
  every agent, by who made it (`llm`, `rule`, `fallback`) and whether it ran
  as proposed (`accepted`) or was `replaced` after validation;
- `lmedge_agent_decision_seconds{agent}`: the time to decide;
- `lmedge_controller_slot`: the slot the controller last finished, and
  `lmedge_controller_slot_duration_seconds` the decision time of a slot;
- `lmedge_node_agent_last_slot{node}`: the last slot a node agent reported a
  decision for (the controller compares it with its own slot to find silent
  node agents);
- `lmedge_store_pending_documents`, `lmedge_store_spilled_documents_total`,
  `lmedge_store_dropped_documents_total`: the process's store buffer (records
  waiting for an unreachable store, written to the spill file, lost).

Each process has its own registry (as the gateways do), rendered with
`render()` or served on a port of its own with `serve()`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import suppress
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    start_http_server,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from lmedge.api.decisions import Decision
from lmedge.api.engine_telemetry import EngineTelemetry
from lmedge.errors import ConfigError
from lmedge.store.buffer import BufferStats

#: Decision-time buckets, seconds: a rule agent's microseconds to an LLM's tens of seconds.
_DECISION_BUCKETS = (1e-4, 1e-3, 0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10, 20, 30, 60)

#: Every metric family this module exports (the Grafana dashboard and the
#: alert rules may name only exported metrics; a test holds them to it).
FAMILIES = (
    "lmedge_agent_decisions",
    "lmedge_agent_decision_seconds",
    "lmedge_controller_slot",
    "lmedge_controller_slot_duration_seconds",
    "lmedge_node_agent_last_slot",
    "lmedge_engine_kv_cache_usage_ratio",
    "lmedge_engine_sequences",
    "lmedge_engine_tokens_per_second",
    "lmedge_store_pending_documents",
    "lmedge_store_spilled_documents",
    "lmedge_store_dropped_documents",
)


class _BufferCollector(Collector):
    """The store buffer's counts, read when scraped (no bookkeeping on the write path)."""

    def __init__(self, stats: Callable[[], BufferStats | None]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        s = self._stats()
        pending = GaugeMetricFamily(
            "lmedge_store_pending_documents",
            "Documents waiting in this process's store buffer (store unreachable or slow).",
        )
        spilled = CounterMetricFamily(
            "lmedge_store_spilled_documents",
            "Documents this process wrote to its spill file because the buffer was full.",
        )
        dropped = CounterMetricFamily(
            "lmedge_store_dropped_documents",
            "Documents this process lost for good: a spill file unwritable or unreadable, "
            "refused by the store, or an _id stored with other content.",
        )
        if s is not None:
            pending.add_metric([], s.pending)
            spilled.add_metric([], s.spilled)
            dropped.add_metric([], s.lost)
        yield from (pending, spilled, dropped)


class ControlPlaneMetrics:
    """The series of one controller or node-agent process."""

    def __init__(self, *, store_stats: Callable[[], BufferStats | None] | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.decisions = Counter(
            "lmedge_agent_decisions",
            "Agent decisions, by agent, source (llm, rule, fallback) and outcome "
            "(accepted, replaced).",
            ["agent", "source", "outcome"],
            registry=self.registry,
        )
        self.decision_seconds = Histogram(
            "lmedge_agent_decision_seconds",
            "Wall time of one agent decision, by agent.",
            ["agent"],
            buckets=_DECISION_BUCKETS,
            registry=self.registry,
        )
        self.slot = Gauge(
            "lmedge_controller_slot",
            "The slot the controller finished last.",
            registry=self.registry,
        )
        self.slot_seconds = Histogram(
            "lmedge_controller_slot_duration_seconds",
            "Decision time of one slot (snapshot, planning, routing, deployers).",
            buckets=_DECISION_BUCKETS,
            registry=self.registry,
        )
        self.node_last_slot = Gauge(
            "lmedge_node_agent_last_slot",
            "The last slot a node agent reported a deployer decision for.",
            ["node"],
            registry=self.registry,
        )
        # A node agent's reading of its token engines (lmedge.api.engine_telemetry),
        # labelled by node and LM: the chart scrapes the agents, not the model pods.
        self.engine_kv = Gauge(
            "lmedge_engine_kv_cache_usage_ratio",
            "Share of a token engine's KV-cache pool in use (0..1), by node and LM.",
            ["node", "lm"],
            registry=self.registry,
        )
        self.engine_sequences = Gauge(
            "lmedge_engine_sequences",
            "Sequences of a token engine, by node, LM and state (running, waiting).",
            ["node", "lm", "state"],
            registry=self.registry,
        )
        self.engine_tokens = Gauge(
            "lmedge_engine_tokens_per_second",
            "Token throughput of a token engine over the last slot, by node, LM and phase "
            "(prompt, generation).",
            ["node", "lm", "phase"],
            registry=self.registry,
        )
        self._engine_lms: dict[str, set[str]] = {}
        if store_stats is not None:
            self.registry.register(_BufferCollector(store_stats))

    def observe_decisions(self, decisions: Iterable[Decision[Any]]) -> None:
        """Count decisions as they are made (any agent, any process)."""
        for d in decisions:
            self.decisions.labels(agent=d.agent, source=d.source, outcome=d.outcome).inc()
            self.decision_seconds.labels(agent=d.agent).observe(d.latency_s)
            if d.agent == "deployer" and d.node is not None:
                self.node_last_slot.labels(node=d.node).set(d.slot)

    def observe_engines(self, node: str, engines: Iterable[EngineTelemetry] | None) -> None:
        """Set `node`'s engine series to this reading; LMs no longer read lose theirs."""
        now: set[str] = set()
        for e in engines or ():
            now.add(e.lm)
            if e.kv_cache_usage is not None:
                self.engine_kv.labels(node=node, lm=e.lm).set(e.kv_cache_usage)
            self.engine_sequences.labels(node=node, lm=e.lm, state="running").set(e.running)
            self.engine_sequences.labels(node=node, lm=e.lm, state="waiting").set(e.waiting)
            for phase, rate in (
                ("prompt", e.prompt_tokens_per_s),
                ("generation", e.generation_tokens_per_s),
            ):
                if rate is not None:
                    self.engine_tokens.labels(node=node, lm=e.lm, phase=phase).set(rate)
        for lm in self._engine_lms.get(node, set()) - now:
            self._forget(node, lm)
        self._engine_lms[node] = now

    def _forget(self, node: str, lm: str) -> None:
        series = [
            (self.engine_kv, (node, lm)),
            *((self.engine_sequences, (node, lm, s)) for s in ("running", "waiting")),
            *((self.engine_tokens, (node, lm, p)) for p in ("prompt", "generation")),
        ]
        for gauge, labels in series:
            with suppress(KeyError):  # never set (an engine without that reading)
                gauge.remove(*labels)

    def observe_slot(self, slot: int, decide_s: float) -> None:
        """A slot finished: its index and how long its decisions took."""
        self.slot.set(slot)
        self.slot_seconds.observe(decide_s)

    def render(self) -> bytes:
        """The `/metrics` body (Prometheus text format)."""
        return generate_latest(self.registry)

    def serve(self, port: int, addr: str = "0.0.0.0") -> None:
        """Serve `/metrics` on `addr:port` from a daemon thread (for processes without HTTP).

        A port that cannot be bound (taken, privileged) is a `ConfigError`.
        """
        try:
            start_http_server(port, addr=addr, registry=self.registry)
        except OSError as exc:
            raise ConfigError(f"--metrics-port {port}: {exc.strerror or exc}") from None
