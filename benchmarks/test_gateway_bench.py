"""Gateway benchmarks (run by `make bench`): routing decision time, forwarding
throughput, and 2,000 concurrent prompt sets without an error or a lost record.

Setup on this machine's 2 cores, all on 127.0.0.1: gateway A (worker-1, the
origin) routes every LM to gateway B (worker-2), which queues the sets for four
stub model pods (one per LM, 0 s per prompt). Each gateway and pod is its own
`lmedge` process, as on a node; the load generator shares the same two cores,
so the figures are a floor. Results are printed and written to
reports/bench-gateway.json.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from benchmarks.processes import lmedge_process as _lmedge
from benchmarks.processes import stop_processes
from benchmarks.processes import wait_ready as _wait_ready
from lmedge.api.decisions import Route, RoutingMap
from lmedge.dataplane.gateway import Gateway, GatewaySettings
from lmedge.dataplane.records import MemorySink
from lmedge.dataplane.wire import RoutingUpdate
from lmedge.store import StoreOptions, open_store
from tests.fixtures.dataplane import free_port

pytestmark = pytest.mark.bench

ROOT = Path(__file__).resolve().parents[1]
SERVICES = ROOT / "examples" / "testbed" / "services.yaml"
MODALITY = {"lm1": "text-to-text", "lm2": "text-to-text", "lm3": "image-to-text",
            "lm4": "text-to-image"}  # fmt: skip
WORKERS = [f"worker-{i}" for i in range(1, 7)]
RESULTS: dict[str, Any] = {}
#: Throughput run: concurrent clients and seconds.
THROUGHPUT_CLIENTS = 64
THROUGHPUT_S = 10.0
#: Concurrency run: sets in flight at once.
CONCURRENT = 2_000


class Cluster:
    """Two gateway processes and four stub model-server processes."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: list[subprocess.Popen[bytes]] = []
        #: Role of each process, for CPU accounting: origin, destination or pod.
        self.roles: dict[int, str] = {}
        self.store = tmp / "store"
        pods: dict[str, str] = {}
        for lm, modality in MODALITY.items():
            port = free_port()
            log = tmp / f"pod-{lm}.log"
            proc = _lmedge(
                "model-server", "--lm", lm, "--modality", modality, "--port", str(port),
                "--progress-dir", str(tmp / "progress"), "--no-fsync", log=log,
            )  # fmt: skip
            self.procs.append(proc)
            self.roles[proc.pid] = "pods"
            pods[lm] = f"http://127.0.0.1:{port}"
            _wait_ready(pods[lm], proc, log)
        self.a_port, self.b_port = free_port(), free_port()
        self.a = f"http://127.0.0.1:{self.a_port}"
        self.b = f"http://127.0.0.1:{self.b_port}"
        peers = ["--peer", f"worker-1={self.a}", "--peer", f"worker-2={self.b}"]
        b_args = [a for lm, url in pods.items() for a in ("--model-url", f"{lm}={url}")]
        for node, port, extra in (("worker-2", self.b_port, b_args), ("worker-1", self.a_port, [])):
            log = tmp / f"gateway-{node}.log"
            proc = _lmedge(
                "gateway", "--node", node, "--services", str(SERVICES), "--port", str(port),
                "--store", str(self.store if node == "worker-1" else tmp / "store-b"),
                "--run", "bench", *peers, *extra, log=log,
            )  # fmt: skip
            self.procs.append(proc)
            self.roles[proc.pid] = "origin" if node == "worker-1" else "destination"
            _wait_ready(f"http://127.0.0.1:{port}", proc, log)
        routes = [{"origin": "worker-1", "lm": lm, "destination": "worker-2"} for lm in MODALITY]
        body = {"run": "bench", "slot": 1, "routing": {"routes": routes}}
        httpx.put(self.a + "/control/routing", json=body, timeout=10).raise_for_status()

    def cpu_seconds(self) -> dict[str, float]:
        """CPU time (user + system) used so far, summed by role."""
        tick = os.sysconf("SC_CLK_TCK")
        used: dict[str, float] = {}
        for proc in self.procs:
            fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
            seconds = (int(fields[11]) + int(fields[12])) / tick  # utime, stime
            role = self.roles[proc.pid]
            used[role] = used.get(role, 0.0) + seconds
        return used

    def stop(self) -> None:
        # Gateways first (SIGTERM: uvicorn drains, the sink flushes the store).
        stop_processes(self.procs)


@pytest.fixture(scope="module")
def testbed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    bed = Cluster(tmp_path_factory.mktemp("gateway-bench"))
    yield bed
    bed.stop()


@pytest.fixture(scope="module", autouse=True)
def report() -> Iterator[None]:
    yield
    out = ROOT / "reports" / "bench-gateway.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(RESULTS, indent=2) + "\n")
    print(f"\ngateway benchmark -> {out}\n{json.dumps(RESULTS, indent=2)}")


def _body(i: int) -> dict[str, Any]:
    lm = ("lm1", "lm2", "lm4")[i % 3]  # text LMs and text-to-image: text prompts only
    return {"id": f"b{i}", "lm": lm, "prompts": [{"text": f"prompt {i}"}]}


def test_routing_decision_latency() -> None:
    """P50/P99 of `Gateway.choose` with the testbed's 6 x 4 routing map installed."""

    async def measure() -> list[float]:
        settings = GatewaySettings(node="worker-1", services=MODALITY)  # type: ignore[arg-type]
        gw = Gateway(settings, peers=None, models=None, sink=MemorySink())  # type: ignore[arg-type]
        routes = [Route(origin=o, lm=lm, destination=WORKERS[(i + 1) % 6])
                  for i, o in enumerate(WORKERS) for lm in MODALITY]  # fmt: skip
        gw.set_routing(RoutingUpdate(slot=1, routing=RoutingMap(routes=routes)))
        lms = list(MODALITY)
        samples: list[float] = []
        for i in range(100_000):
            start = time.perf_counter_ns()
            gw.choose(lms[i % 4])
            samples.append((time.perf_counter_ns() - start) / 1e3)
        await gw.close()
        return samples

    samples = sorted(asyncio.run(measure()))
    p50, p99 = samples[len(samples) // 2], samples[int(len(samples) * 0.99)]
    RESULTS["routing_decision_us"] = {"p50": round(p50, 2), "p99": round(p99, 2), "n": len(samples)}
    assert p99 < 1_000  # well under a millisecond


def test_forwarding_throughput(testbed: Cluster) -> None:
    """Sets per second through A -> B -> stub pods, 64 clients for 10 s."""

    async def load() -> tuple[int, int, list[float]]:
        ok = errors = 0
        latencies: list[float] = []
        # Idle client connections expire before the server's 5 s keep-alive.
        limits = httpx.Limits(max_connections=THROUGHPUT_CLIENTS, keepalive_expiry=2.0)
        async with httpx.AsyncClient(limits=limits, timeout=30) as client:
            end = time.monotonic() + THROUGHPUT_S
            counter = iter(range(10**9))

            async def worker() -> None:
                nonlocal ok, errors
                while time.monotonic() < end:
                    start = time.monotonic()
                    try:
                        r = await client.post(
                            testbed.a + "/v1/prompt-sets", json=_body(next(counter))
                        )
                    except httpx.HTTPError as exc:
                        errors += 1
                        print(f"client error: {type(exc).__name__}: {exc}")
                        continue
                    if r.status_code == 200 and r.json()["outcome"] == "success":
                        ok += 1
                        latencies.append(time.monotonic() - start)
                    else:
                        errors += 1
                        print(f"failed set: {r.status_code} {r.text[:200]}")

            await asyncio.gather(*(worker() for _ in range(THROUGHPUT_CLIENTS)))
        return ok, errors, latencies

    before = testbed.cpu_seconds()
    ok, errors, latencies = asyncio.run(load())
    after = testbed.cpu_seconds()
    latencies.sort()
    # CPU per set is what the throughput on dedicated cores follows; the wall-clock
    # rate above shares the two cores with the load generator and other work.
    cpu_ms = {role: round(1e3 * (after[role] - before[role]) / max(ok, 1), 2) for role in after}
    RESULTS["forwarding"] = {
        "requests_per_s": round(ok / THROUGHPUT_S, 1),
        "errors": errors,
        "clients": THROUGHPUT_CLIENTS,
        "latency_ms_p50": round(1e3 * statistics.median(latencies), 2),
        "latency_ms_p99": round(1e3 * latencies[int(len(latencies) * 0.99)], 2),
        "cores": os.cpu_count(),
        "cpu_ms_per_set": cpu_ms,
        "sets_per_cpu_second_origin_gateway": round(1e3 / cpu_ms["origin"], 1) if ok else 0,
        "load_average_1m": round(os.getloadavg()[0], 2),
    }
    assert errors == 0 and ok > 0


async def _post_raw(port: int, path: str, body: bytes) -> tuple[int, bytes]:
    """One POST on its own connection with asyncio streams.

    The burst does not use httpx: its connection pool rescans its queue on
    every change, which at 2,000 waiting requests makes the client, not the
    gateway, the bottleneck.
    """
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    writer.write(head.encode() + body)
    await writer.drain()
    data = await reader.read()
    writer.close()
    await writer.wait_closed()
    status_line, _, rest = data.partition(b"\r\n")
    return int(status_line.split(b" ", 2)[1]), rest.partition(b"\r\n\r\n")[2]


def test_two_thousand_concurrent_sets_no_error_no_lost_record(testbed: Cluster) -> None:
    """2,000 sets in flight at once: every one answered, every record stored."""

    async def burst() -> list[str]:
        async def one(i: int) -> str | None:
            body = json.dumps({**_body(i), "id": f"c{i}"}).encode()
            try:
                status, payload = await asyncio.wait_for(
                    _post_raw(testbed.a_port, "/v1/prompt-sets", body), 600
                )
            except (OSError, TimeoutError) as exc:
                return f"{type(exc).__name__}: {exc}"
            if status != 200 or json.loads(payload)["outcome"] != "success":
                return f"{status}: {payload[:100]!r}"
            return None

        start = time.monotonic()
        failures = await asyncio.gather(*(one(i) for i in range(CONCURRENT)))
        elapsed = time.monotonic() - start
        RESULTS["concurrency"] = {"sets": CONCURRENT, "seconds": round(elapsed, 2)}
        return [f for f in failures if f]

    failures = asyncio.run(burst())
    testbed.stop()  # SIGTERM: gateway A drains and flushes its records into its store
    options = StoreOptions(spill_dir=testbed.tmp / "spill")
    with open_store(str(testbed.store), options=options, read_only=True) as store:
        stored = {r.id for r in store.requests("bench") if r.id.startswith("c")}
    RESULTS["concurrency"].update(
        {"errors": len(failures), "records_stored": len(stored), "lost": CONCURRENT - len(stored)}
    )
    assert failures == []
    assert len(stored) == CONCURRENT
