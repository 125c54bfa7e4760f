"""The telemetry collector against local HTTP servers serving real exposition text
of node-exporter and dcgm-exporter, and against a Prometheus-compatible query API."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest

from lmedge.nodeagent.telemetry import (
    ExporterTargets,
    PrometheusTelemetry,
    TelemetryCollector,
    parse_exposition,
)
from lmedge.store import StoreOptions, open_store
from tests.fixtures.dataplane import free_port

SAMPLES = Path(__file__).resolve().parents[1] / "fixtures" / "exporters"


class Exporter:
    """A loopback HTTP server answering GET /metrics with `self.body`."""

    def __init__(self, body: str) -> None:
        self.body = body
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                payload = exporter.respond(self.path).encode()
                self.send_response(200)
                self.send_header("Content-Type", exporter.content_type)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: object) -> None:
                return None

        self.content_type = "text/plain; version=0.0.4"
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def respond(self, path: str) -> str:
        return self.body

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def exporters() -> Iterator[dict[str, Exporter]]:
    servers = {
        "w1-node": Exporter((SAMPLES / "node-exporter.txt").read_text()),
        "w6-node": Exporter((SAMPLES / "node-exporter.txt").read_text()),
        "w6-dcgm": Exporter((SAMPLES / "dcgm-exporter.txt").read_text()),
    }
    yield servers
    for server in servers.values():
        server.close()


def _since_boot_cpu() -> float:
    rows = parse_exposition((SAMPLES / "node-exporter.txt").read_text())["node_cpu_seconds_total"]
    total = sum(v for _, v in rows)
    idle = sum(v for labels, v in rows if labels["mode"] in ("idle", "iowait"))
    return 1 - idle / total


def test_scrapes_nodes_concurrently_and_stores_snapshots(
    exporters: dict[str, Exporter], tmp_path: Path
) -> None:
    dead = f"http://127.0.0.1:{free_port()}/metrics"
    now = [120.0]
    collector = TelemetryCollector(
        [
            ExporterTargets("worker-1", exporters["w1-node"].url + "/metrics"),
            ExporterTargets(
                "worker-6", exporters["w6-node"].url + "/metrics", exporters["w6-dcgm"].url + "/m"
            ),
            ExporterTargets("worker-9", dead),
        ],
        run="tele",
        clock=lambda: now[0],
        timeout_s=30.0,  # generous: a loaded CI machine; the dead target fails at once
    )
    store = open_store(str(tmp_path / "store"), options=StoreOptions(spill_dir=tmp_path / "spill"))
    try:
        first = asyncio.run(collector.collect_into(store))
        by_node = {s.node: s for s in first}
        assert sorted(by_node) == ["worker-1", "worker-6"]  # worker-9 did not answer
        w1, w6 = by_node["worker-1"], by_node["worker-6"]
        assert w1.cpu_util == pytest.approx(_since_boot_cpu())
        assert w1.memory_util == pytest.approx(0.375)  # 15 of 24 GiB available
        assert w1.gpu_util == [] and w1.vram_used_gib == []  # CPU-only node
        assert w6.gpu_util == pytest.approx([0.87, 0.0])
        assert w6.vram_used_gib == pytest.approx([12306 / 1024, 368 / 1024])
        assert w6.extra["gpu0_power_w"] == pytest.approx(187.412)
        assert w6.extra["load1"] == pytest.approx(2.37)
        assert w6.source == "exporter" and w6.time_s == 120.0 and w6.run == "tele"

        # 15 s later: utilisation over the interval, from the counters' deltas.
        exporters["w1-node"].body = (SAMPLES / "node-exporter-15s.txt").read_text()
        now[0] = 135.0
        second = {s.node: s for s in asyncio.run(collector.collect_into(store))}
        assert second["worker-1"].cpu_util == pytest.approx(0.6)
        assert second["worker-1"].memory_util == pytest.approx(0.5)
        stored = store.telemetry(node="worker-1", run="tele")
        assert len(stored) == 2 and {s.cpu_util for s in stored} == {
            w1.cpu_util,
            second["worker-1"].cpu_util,
        }
    finally:
        store.close()


def test_queries_prometheus_when_configured() -> None:
    answers = {
        "node_cpu_seconds_total": [({"instance": "10.0.0.3:9100"}, "0.42")],
        "MemAvailable": [({"instance": "10.0.0.3:9100"}, "0.31")],
        "DCGM_FI_DEV_GPU_UTIL": [
            ({"Hostname": "worker-3", "gpu": "0"}, "55"),
            ({"Hostname": "worker-3", "gpu": "1"}, "5"),
        ],
        "DCGM_FI_DEV_FB_USED": [({"Hostname": "worker-3", "gpu": "0"}, "2048")],
    }
    seen: list[str] = []

    class Prometheus(Exporter):
        def respond(self, path: str) -> str:
            query = parse_qs(urlparse(path).query)["query"][0]
            seen.append(query)
            key = next(k for k in answers if k in query)
            result = [{"metric": m, "value": [1700000000.0, v]} for m, v in answers[key]]
            return json.dumps(
                {"status": "success", "data": {"resultType": "vector", "result": result}}
            )

    server = Prometheus("")
    server.content_type = "application/json"
    try:
        source = PrometheusTelemetry(
            server.url, {"worker-3": "10.0.0.3:9100", "worker-4": "10.0.0.4:9100"},
            clock=lambda: 5.0,
        )  # fmt: skip
        [snap] = asyncio.run(source.collect())
    finally:
        server.close()
    assert snap.node == "worker-3" and snap.source == "prometheus"
    assert (snap.cpu_util, snap.memory_util) == pytest.approx((0.42, 0.31))
    assert snap.gpu_util == pytest.approx([0.55, 0.05]) and snap.vram_used_gib == [2.0]
    assert len(seen) == 4
