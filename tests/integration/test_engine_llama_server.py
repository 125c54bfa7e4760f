"""llama.cpp's own `llama-server` as an `openai`-protocol engine pod behind a real
gateway: the sampling parameters reach it (a seed and a temperature give the
same output twice, a stop sequence stops it), and the node agent's scraper
reads its KV-cache usage from `/slots`.

The binary comes from `make tools` (tools/build-llama-server.sh), the model
from tools/build-llama.sh; without them the tests skip with the command to
run, or fail where `LMEDGE_REQUIRE_TOOLS=1` (CI).
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import openai
import pytest

from lmedge.agents.local_llm import model_path
from lmedge.api.engine_telemetry import EngineTelemetry
from lmedge.bench.llama_server import (
    LlamaServer,
    ServerConfig,
    binary_path,
    missing_reason,
    running_llama_server,
)
from lmedge.dataplane.records import MemorySink
from lmedge.nodeagent.telemetry import EngineScraper, EngineTarget
from tests.fixtures.dataplane import TOKEN, control, free_port, gateway

pytestmark = pytest.mark.slow

SLOTS, SLOT_CONTEXT = 2, 512


@dataclass
class Engine:
    server: LlamaServer
    client: openai.OpenAI


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    if why := missing_reason(binary_path(), model_path()):
        if os.environ.get("LMEDGE_REQUIRE_TOOLS", "") not in ("", "0", "false"):
            pytest.fail(why)
        pytest.skip(why)
    config = ServerConfig(parallel=SLOTS, slot_context=SLOT_CONTEXT, threads=2, metrics=True)
    log = tmp_path_factory.mktemp("llama-server") / "server.log"
    with running_llama_server(binary_path(), model_path(), config, log, free_port()) as server:
        _, srv = gateway("worker-1", MemorySink(), tau=120)
        try:
            pod = {"lm": "lm1", "url": server.url, "protocol": "openai"}
            control(srv.url, "/control/models", {"models": [pod]})
            client = openai.OpenAI(
                base_url=srv.url + "/v1", api_key=TOKEN, max_retries=0, timeout=120
            )
            yield Engine(server, client)
        finally:
            srv.stop()


PROMPT = "Once upon a time, in a small village by the sea,"


def test_a_seed_and_a_temperature_give_the_same_output_twice(engine: Engine) -> None:
    # llama-server draws a fresh seed per request unless given one: were the
    # seed dropped on the way, two samples at temperature 1 would differ.
    def sample() -> str:
        answer = engine.client.completions.create(
            model="lm1", prompt=PROMPT, max_tokens=16, temperature=1.0, seed=1234
        )
        return answer.choices[0].text

    first = sample()
    assert first and sample() == first


def test_a_stop_sequence_stops_the_stream_before_it(engine: Engine) -> None:
    def stream(**kw: object) -> str:
        chunks = engine.client.completions.create(
            model="lm1", prompt=PROMPT, max_tokens=16, temperature=0.0, stream=True, **kw
        )
        return "".join(c.choices[0].text for c in chunks if c.choices)

    whole = stream()
    words = [w for w in whole.split() if len(w) >= 3 and whole.find(w) > 0]
    assert words, f"greedy output without a word to stop at: {whole!r}"
    stop = words[len(words) // 2]
    assert stream(stop=[stop]) == whole[: whole.find(stop)]


def test_the_scraper_reads_kv_usage_from_slots_while_a_request_runs(engine: Engine) -> None:
    url = engine.server.url
    target = EngineTarget("lm1", "lm1-pod", url + "/metrics")
    scraper = EngineScraper(timeout_s=10)
    body = {"prompt": PROMPT, "n_predict": 48, "ignore_eos": True, "temperature": 0.0}
    request = threading.Thread(
        target=lambda: httpx.post(url + "/completion", json=body, timeout=300).raise_for_status()
    )
    request.start()
    readings: list[EngineTelemetry] = []
    while request.is_alive():
        readings += asyncio.run(scraper.scrape([target])) or []
        request.join(timeout=0.2)  # a scrape every 0.2 s, as a (fast) node agent would
    busy = [r.kv_cache_usage for r in readings if r.running >= 1 and r.kv_cache_usage]
    assert busy, readings
    # one sequence: its prompt and at most 48 new tokens, of both slots' context
    assert all(0 < kv <= (48 + 64) / (SLOTS * SLOT_CONTEXT) for kv in busy)
    (idle,) = asyncio.run(scraper.scrape([target])) or []
    assert (idle.running, idle.kv_cache_usage) == (0, 0.0)
