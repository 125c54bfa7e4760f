"""CEMA routing each request over two llama.cpp models through real `lmedge gateway` processes.

tests/fixtures/cema-llama: two LMServices, `small` and `large`, serve the
request class `summary`. Offline only one GGUF is installable (the tests'
gemma-3-270m, tools/build-llama.sh), so both are that model in two
`llama-server` processes; they differ in their declared profile and quality
prior and in the quality-store model each maps onto (`store.models`). worker-2's
gateway has both engines as `openai`-protocol pods; worker-1's has none. The
push to worker-1 carries `RequestRouting` with `cema-request` and the quality
store (`predictor: store`, the shipped `quality-store.npz`), as the
controller's cluster backend sends it. Every request is served by a real
engine, and every window the router decides is one `Decision` in worker-1's
store with its routes (one gene per request), CEMA's terms and the seed's J.

Skips without the llama.cpp tools (`make tools`; fails where
`LMEDGE_REQUIRE_TOOLS=1`) or without the `cema` extra (faiss, MiniLM).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from lmedge.agents.local_llm import model_path
from lmedge.api import InstanceState, NodeState, Route, Snapshot
from lmedge.api.decisions import RoutingMap
from lmedge.api.gateway_control import RequestRouting, RoutingUpdate
from lmedge.api.runconfig import PolicyConfig
from lmedge.bench.llama_server import (
    ServerConfig,
    binary_path,
    missing_reason,
    running_llama_server,
)
from lmedge.policies.cema import rag_available
from lmedge.sim.scenario import load_scenario
from lmedge.store import open_store
from tests.fixtures.dataplane import free_port
from tests.integration.test_dataplane_model_routing import CONTROL, REPO, RUN, Gateway

pytestmark = pytest.mark.slow

SCENARIO = REPO / "tests" / "fixtures" / "cema-llama"
SERVICES = SCENARIO / "services.yaml"
CLASS = "summary"
LMS = ("small", "large")
#: lmedge LM -> the quality store's model: a small and a large one
STORE_MODELS = {"small": "latent-0.3b", "large": "latent-8b"}
HEADERS = {"Authorization": f"Bearer {CONTROL}"}


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Gateway]:
    if why := missing_reason(binary_path(), model_path()):
        if os.environ.get("LMEDGE_REQUIRE_TOOLS", "") not in ("", "0", "false"):
            pytest.fail(why)
        pytest.skip(why)
    if why := rag_available():
        pytest.skip(why)
    config = ServerConfig(parallel=1, slot_context=512, threads=1)
    with contextlib.ExitStack() as stack:
        engines = [
            stack.enter_context(
                running_llama_server(
                    binary_path(), model_path(), config, tmp_path / f"{lm}.log", free_port()
                )
            )
            for lm in LMS
        ]
        p1, p2 = free_port(), free_port()
        peers = [
            "--peer", f"worker-1=http://127.0.0.1:{p1}", "--peer", f"worker-2=http://127.0.0.1:{p2}",
        ]  # fmt: skip
        dest = Gateway(tmp_path, "worker-2", p2, *peers, services=SERVICES)
        stack.callback(dest.stop)
        pods = [
            {"lm": lm, "url": e.url, "protocol": "openai"}
            for lm, e in zip(LMS, engines, strict=True)
        ]
        answer = httpx.put(
            dest.url + "/control/models", json={"models": pods}, headers=HEADERS, timeout=10
        )
        assert answer.status_code == 200, answer.text
        origin = Gateway(tmp_path, "worker-1", p1, *peers, services=SERVICES)
        stack.callback(origin.stop)
        yield origin


def _push(gateway: Gateway, slot: int) -> httpx.Response:
    ctx = load_scenario(SCENARIO).context()
    ready = [InstanceState(lm=lm, mode="cpu", cpu_cores=2, vgpus=0, status="ready") for lm in LMS]
    router = {"generations": 5, "predictor": "store", "store": {"models": STORE_MODELS}}
    update = RoutingUpdate(
        run=RUN,
        slot=slot,
        # the map, the last fallback: the class to the small model at worker-2
        routing=RoutingMap(
            routes=[Route(origin="worker-1", lm=CLASS, destination="worker-2", model="small")]
        ),
        services={s.name: s.spec.modality for s in ctx.services},
        classes={CLASS: list(LMS)},
        requests=RequestRouting(
            policy=PolicyConfig(profile="cema-request", params={"router": router}),
            context=ctx,
            snapshot=Snapshot(
                slot=slot, time_s=0.0, nodes=[NodeState(name="worker-2", instances=ready)]
            ),
            window_s=0.5,
            budget_s=2.0,
        ),
    )
    return httpx.put(
        gateway.url + "/control/routing",
        content=update.model_dump_json(),
        headers={**HEADERS, "Content-Type": "application/json"},
        timeout=30,
    )


def test_cema_request_routes_over_two_llama_cpp_models_with_the_quality_store(
    cluster: Gateway,
) -> None:
    origin = cluster
    assert _push(origin, 1).status_code == 200
    client = openai.OpenAI(
        base_url=origin.url + "/v1", api_key="unused", max_retries=0, timeout=120
    )

    def ask() -> tuple[str, str]:
        messages: Any = [{"role": "user", "content": "Summarize: the cat sat on the mat."}]
        raw = client.chat.completions.with_raw_response.create(
            model=CLASS, messages=messages, max_tokens=4, temperature=0.0
        )
        assert raw.parse().choices, "no answer"
        return raw.headers["x-lmedge-destination"], raw.headers["x-lmedge-model"]

    def windows() -> dict[str, int]:
        status = httpx.get(origin.url + "/control/status", headers=HEADERS, timeout=10).json()
        return dict(status["windows"] or {})

    # The router's build loads the store and MiniLM and compiles CEMA's kernel:
    # until then windows go by the seed or the map, and every request is served.
    asked = 0
    deadline = time.monotonic() + 400  # generous: a loaded 2-core machine
    served: list[tuple[str, str]] = []
    while time.monotonic() < deadline and (asked < 4 or windows().get("router", 0) < 2):
        served.append(ask())
        asked += 1
    assert windows().get("router", 0) >= 2, (windows(), origin.log.read_text()[-3000:])
    assert all(dest == "worker-2" and model in LMS for dest, model in served), served

    assert origin.stop() in (0, -15), origin.log.read_text()
    with open_store(str(origin.store), read_only=True) as store:
        records = {r.id: r for r in store.requests(RUN)}
        decisions = store.decisions(agent="scheduler", run=RUN, limit=1000)
    assert len(records) == asked and all(r.outcome == "success" for r in records.values())
    assert all(r.lm == CLASS and r.model in LMS for r in records.values())
    audits = [d.window for d in decisions if d.window is not None]
    assert sorted(a.request for w in audits for a in w.routes) == sorted(records)
    routed = [d for d in decisions if d.window is not None and d.window.used == "router"]
    assert routed, [d.error for d in decisions]
    for d in routed:
        w = d.window
        assert w is not None and d.policy == "cema-request" and d.source == "rule"
        # one gene per request, followed: each went where its window sent it
        assert len(w.routes) == w.requests
        for a in w.routes:
            assert (records[a.request].destination, records[a.request].model) == (
                a.destination,
                a.model,
            )
        # CEMA's terms and the seed's J; the search starts from the seed and keeps its elite
        assert w.j is not None and w.seed_j is not None and w.j <= w.seed_j + 1e-9
        assert w.quality_loss is not None and 0.0 <= w.quality_loss <= 1.0
