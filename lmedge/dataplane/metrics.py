"""Prometheus metrics of one gateway, in a registry of its own.

A private `CollectorRegistry` per gateway (not the process default) lets tests
and benchmarks run several gateways in one process without name clashes.
Stage histograms are observed at the origin, where the four stages are known;
queue depth at the destination, where the queues are.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from lmedge.api.records import RequestRecord

#: Stage latency buckets, seconds: sub-second loopback up to tau = 900 s.
_STAGE_BUCKETS = (0.005, 0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 900)
#: Routing decision buckets, seconds (a dict lookup: microseconds).
_DECISION_BUCKETS = (1e-6, 5e-6, 1e-5, 5e-5, 1e-4, 5e-4, 1e-3, 1e-2)


class GatewayMetrics:
    """The gateway's series; `render()` is the `/metrics` body."""

    def __init__(self, node: str) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        labels = {"node": node}
        self.stage = Histogram(
            "lmedge_gateway_stage_seconds",
            "Stage time of prompt sets submitted at this node, by LM and stage.",
            ["lm", "stage"],
            buckets=_STAGE_BUCKETS,
            registry=self.registry,
        )
        self.requests = Counter(
            "lmedge_gateway_requests",
            "Prompt sets submitted at this node, by LM and outcome.",
            ["lm", "outcome"],
            registry=self.registry,
        )
        self.success_ratio = Gauge(
            "lmedge_gateway_success_ratio",
            "Successful / submitted prompt sets at this node since start, by LM.",
            ["lm"],
            registry=self.registry,
        )
        self.conflicts = Counter(
            "lmedge_gateway_conflicts",
            "Prompt sets that reached a destination where their LM was not active.",
            ["lm"],
            registry=self.registry,
        )
        self.queue_depth = Gauge(
            "lmedge_gateway_queue_depth",
            "Prompt sets waiting in this node's FIFO queue, by LM.",
            ["lm"],
            registry=self.registry,
        )
        self.decision = Histogram(
            "lmedge_gateway_routing_decision_seconds",
            "Time to choose a destination for one prompt set.",
            buckets=_DECISION_BUCKETS,
            registry=self.registry,
        )
        self.info = Gauge(
            "lmedge_gateway_info",
            "Constant 1, labelled with the node.",
            list(labels),
            registry=self.registry,
        )
        self.info.labels(**labels).set(1)
        self._counts: dict[str, list[int]] = {}

    def observe(self, record: RequestRecord) -> None:
        """Count one finished prompt set and its stage times.

        A set refused by admission control (`rejected`) is counted, but adds no
        stage samples: its zeros are not latencies and would drag them down.
        """
        if record.outcome != "rejected":
            for stage, value in (
                ("uplink", record.uplink_s),
                ("queue", record.queue_s),
                ("inference", record.inference_s),
                ("downlink", record.downlink_s),
                ("total", record.latency_s),
            ):
                self.stage.labels(lm=record.lm, stage=stage).observe(value)
        self.requests.labels(lm=record.lm, outcome=record.outcome).inc()
        if record.conflict:
            self.conflicts.labels(lm=record.lm).inc()
        counts = self._counts.setdefault(record.lm, [0, 0])
        counts[0] += 1
        counts[1] += record.outcome == "success"
        self.success_ratio.labels(lm=record.lm).set(counts[1] / counts[0])

    def set_depth(self, lm: str, depth: int) -> None:
        self.queue_depth.labels(lm=lm).set(depth)

    def render(self) -> bytes:
        return generate_latest(self.registry)
