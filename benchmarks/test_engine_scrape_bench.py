"""The controller's engine scrape at 1,000 token-engine pods (run by `make bench`; issue 30).

On a cluster the controller reads every token-engine pod's `/metrics` once a
slot (`KubernetesBackend(engines=EngineScraper(...))`, the telemetry in each
node's snapshot) and, for a llama.cpp pod whose page has no KV gauge, its
`/slots` too. This bench serves 1,000 such pods from another process (one
asyncio server listening on 1,000 local ports: 500 vLLM pods with a full
V1-engine page, about 30 KB of histograms like a real server's, and 500
llama.cpp pods with the `--metrics` page and a 4-slot `/slots` JSON) and times
the controller's real read (`EngineScraper.read_targets`, as
`EngineScraper.read` calls it from the slot path) slot after slot.

Measured per slot: wall time and this process's CPU time (the server's is
not counted: it is another process; its CPU a slot is printed beside), p50
and p95 over the slots; the pods
read (every one, every slot, is required: a pod left out is telemetry the
planner does not see); and the process's peak RSS. Target: p95 wall within
a quarter of the 30-s slot (the controller's budget for it) and every pod
read. LMEDGE_SCRAPE_PODS (default 1000) and LMEDGE_SCRAPE_SLOTS (default 20)
narrow a run. Written to reports/bench-engine-scrape.json.
"""

from __future__ import annotations

import asyncio
import functools
import json
import multiprocessing
import os
import resource
import statistics
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import pytest

from lmedge.nodeagent.telemetry import EngineScraper, EngineTarget

pytestmark = pytest.mark.bench

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "engines"
SLOT_S = 30.0
BUDGET_S = SLOT_S / 4

_MODEL = 'model_name="Qwen/Qwen2.5-1.5B-Instruct",engine="0"'
_LATENCY: tuple[float, ...] = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5)
_LATENCY += (0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
_TOKENS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000)
_HISTOGRAMS = {
    "vllm:time_to_first_token_seconds": _LATENCY,
    "vllm:time_per_output_token_seconds": _LATENCY,
    "vllm:inter_token_latency_seconds": _LATENCY,
    "vllm:e2e_request_latency_seconds": _LATENCY,
    "vllm:request_queue_time_seconds": _LATENCY,
    "vllm:request_inference_time_seconds": _LATENCY,
    "vllm:request_prefill_time_seconds": _LATENCY,
    "vllm:request_decode_time_seconds": _LATENCY,
    "vllm:request_prompt_tokens": _TOKENS,
    "vllm:request_generation_tokens": _TOKENS,
    "vllm:iteration_tokens_total": _TOKENS,
    "vllm:request_max_num_generation_tokens": _TOKENS,
    "vllm:request_params_max_tokens": _TOKENS,
    "vllm:request_params_n": (1, 2, 5, 10, 20),
}


def vllm_page(n: int) -> str:
    """A vLLM V1 /metrics page after `n` requests: the gauges and counters the
    scraper reads among every histogram a real server exports, and the process
    and HTTP metrics around them."""
    out: list[str] = []
    for name, kind, value in (
        ("vllm:num_requests_running", "gauge", n % 7),
        ("vllm:num_requests_waiting", "gauge", n % 3),
        ("vllm:kv_cache_usage_perc", "gauge", (n % 100) / 100),
        ("vllm:prefix_cache_queries_total", "counter", 900 * n),
        ("vllm:prefix_cache_hits_total", "counter", 300 * n),
        ("vllm:num_preemptions_total", "counter", n // 50),
        ("vllm:prompt_tokens_total", "counter", 812 * n),
        ("vllm:generation_tokens_total", "counter", 200 * n),
    ):
        out += [f"# HELP {name} {name}.", f"# TYPE {name} {kind}", f"{name}{{{_MODEL}}} {value}"]
    out += ["# HELP vllm:request_success_total Count of successfully processed requests."]
    out += ["# TYPE vllm:request_success_total counter"]
    for reason in ("stop", "length", "abort"):
        out.append(f'vllm:request_success_total{{{_MODEL},finished_reason="{reason}"}} {n}')
    for name, bounds in _HISTOGRAMS.items():
        out += [f"# HELP {name} Histogram of {name}.", f"# TYPE {name} histogram"]
        for i, le in enumerate(bounds):
            out.append(f'{name}_bucket{{{_MODEL},le="{float(le)}"}} {n * (i + 1) // len(bounds)}')
        out.append(f'{name}_bucket{{{_MODEL},le="+Inf"}} {n}')
        out += [f"{name}_count{{{_MODEL}}} {n}", f"{name}_sum{{{_MODEL}}} {n * 1.5}"]
        out.append(f"{name}_created{{{_MODEL}}} 1.7e9")
    for handler in ("/v1/completions", "/v1/chat/completions", "/metrics", "/health"):
        labels = f'handler="{handler}",method="POST"'
        out.append(f'http_requests_total{{{labels},status="2xx"}} {n}')
        for le in (0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0):
            out.append(f'http_request_duration_seconds_bucket{{{labels},le="{le}"}} {n}')
        out.append(f'http_request_duration_seconds_bucket{{{labels},le="+Inf"}} {n}')
    for gen in range(3):
        out.append(f'python_gc_objects_collected_total{{generation="{gen}"}} {1000 * n}')
        out.append(f'python_gc_collections_total{{generation="{gen}"}} {n}')
    out += ["process_resident_memory_bytes 2.1e9", "process_cpu_seconds_total 812.3"]
    return "\n".join(out) + "\n"


def llamacpp_page(n: int) -> str:
    """A llama.cpp server's `--metrics` page (no KV gauge) after `n` requests."""
    text = (FIXTURES / "llamacpp.txt").read_text()
    return text.replace(" 1200\n", f" {1200 + 40 * n}\n").replace(" 3000\n", f" {3000 + 90 * n}\n")


def _serve(pods: int, pipe: Connection) -> None:
    """The pods: `pods` ports on 127.0.0.1, even ones vLLM, odd ones llama.cpp."""
    slots = (FIXTURES / "llamacpp-slots.json").read_bytes()
    hits = [0] * pods

    @functools.cache
    def page(kind: int, n: int) -> bytes:
        # Every pod's n-th page is the same: the server's work stays small beside the
        # client's, whose CPU is what is measured.
        return (vllm_page(n) if kind == 0 else llamacpp_page(n)).encode()

    class Pod(asyncio.Protocol):
        def __init__(self, index: int) -> None:
            self.index = index
            self.buffer = b""

        def connection_made(self, transport: Any) -> None:
            self.transport = transport

        def data_received(self, data: bytes) -> None:
            self.buffer += data
            while b"\r\n\r\n" in self.buffer:
                head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
                path = head.split(b" ", 2)[1]
                if path == b"/slots":
                    body = slots
                else:
                    hits[self.index] += 1
                    body = page(self.index % 2, hits[self.index])
                self.transport.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n"
                    % len(body)
                    + body
                )

    async def main() -> None:
        loop = asyncio.get_running_loop()
        servers = [
            await loop.create_server(functools.partial(Pod, i), "127.0.0.1", 0) for i in range(pods)
        ]
        pipe.send([s.sockets[0].getsockname()[1] for s in servers])
        await loop.run_in_executor(None, pipe.recv)  # until told to stop

    asyncio.run(main())
    pipe.send(time.process_time())


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def test_engine_scrape_at_1000_pods() -> None:
    pods = int(os.environ.get("LMEDGE_SCRAPE_PODS", "1000"))
    slots = int(os.environ.get("LMEDGE_SCRAPE_SLOTS", "20"))
    ours, theirs = multiprocessing.get_context("fork").Pipe()
    server = multiprocessing.get_context("fork").Process(target=_serve, args=(pods, theirs))
    server.start()
    try:
        ports = ours.recv()
        targets = [
            EngineTarget(
                lm="vllm-lm" if i % 2 == 0 else "llama-lm",
                pod=f"pod-{i}",
                url=f"http://127.0.0.1:{port}/metrics",
            )
            for i, port in enumerate(ports)
        ]
        # As the controller builds it (lmedge.processes.controller).
        scraper = EngineScraper(timeout_s=min(EngineScraper.timeout_s, BUDGET_S), budget_s=BUDGET_S)
        walls: list[float] = []
        cpus: list[float] = []
        read: list[int] = []
        for _ in range(slots):
            wall, cpu = time.perf_counter(), time.process_time()
            telemetry = scraper.read_targets(targets) or []
            walls.append(time.perf_counter() - wall)
            cpus.append(time.process_time() - cpu)
            read.append(len(telemetry))
        ours.send("stop")
        server_cpu_s = ours.recv()
    finally:
        server.join(timeout=10)
        if server.is_alive():
            server.terminate()
    page = len(vllm_page(1))
    result = {
        "pods": pods,
        "slots": slots,
        "vllm_page_bytes": page,
        "llamacpp_page_bytes": len(llamacpp_page(1)),
        "wall_s_p50": round(statistics.median(walls), 3),
        "wall_s_p95": round(_percentile(walls, 0.95), 3),
        "cpu_s_p50": round(statistics.median(cpus), 3),
        "cpu_s_p95": round(_percentile(cpus, 0.95), 3),
        "first_slot_wall_s": round(walls[0], 3),
        # The pods' server, all slots together: the machine's other load during the read.
        "server_cpu_s_per_slot": round(server_cpu_s / slots, 3),
        "pods_read_min": min(read),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "budget_s": BUDGET_S,
        "load_average": os.getloadavg()[0],
    }
    out = ROOT / "reports" / "bench-engine-scrape.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    assert min(read) == pods, f"pods left out of a slot's telemetry: {result}"
    assert result["wall_s_p95"] <= BUDGET_S, f"over a quarter of the slot: {result}"
