"""LYREO's trained policy routing requests through real `lmedge gateway` processes.

tests/fixtures/lyreo-gateways: examples/lyreo's LM (Llama-3.2-1B on vLLM)
on two RTX 3090 servers, s1 and s2, each with a gateway and a stub pod of
the LM; the origin is a third gateway (control, no GPU, no pods). The push
to the origin carries `RequestRouting` with the profile `lyreo` (the
package's trained actor, `lmedge/policies/lyreo/trained/lyreo.json`) and a
snapshot whose engine telemetry has s1's KV pool nearly full and its batch
over the engine's 128 sequences, s2 nearly idle; the slot's map sends the
LM to s1. Every window the router decides sends every request to s2: s1
comes first in manifest order (ties would go there), so this is the
telemetry, not a tie. Windows that went by LYREO's fallback (`ll-kv`, least
KV memory-time, while the router is still being built) avoid s1 too; those
that went by the map (s1) are served but not asserted on destination.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from lmedge.api import InstanceState, NodeState, Route, Snapshot
from lmedge.api.decisions import RoutingMap
from lmedge.api.engine_telemetry import EngineTelemetry
from lmedge.api.gateway_control import RequestRouting, RoutingUpdate
from lmedge.api.runconfig import PolicyConfig
from lmedge.modelserver.app import ModelServer
from lmedge.modelserver.app import create_app as create_model_app
from lmedge.modelserver.backends import StubBackend
from lmedge.policies.lyreo.learning.actor import shipped_policy
from lmedge.sim.scenario import load_scenario
from lmedge.store import open_store
from tests.fixtures.dataplane import ServerThread, free_port
from tests.integration.test_dataplane_model_routing import CONTROL, REPO, RUN, Gateway

SCENARIO = REPO / "tests" / "fixtures" / "lyreo-gateways"
SERVICES = REPO / "examples" / "lyreo" / "services.yaml"
LM = "llama-1b"
FULL, FREE = "s1-rtx3090", "s2-rtx3090"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Gateway]:
    pods = [
        ServerThread(
            create_model_app(
                ModelServer(
                    LM,
                    StubBackend(lm=LM, modality="text-to-text", seconds=0.01),
                    tmp_path / f"progress-{node}",
                ),
                load_in_background=False,
            )
        ).start()
        for node in (FULL, FREE)
    ]
    ports = {node: free_port() for node in ("control", FULL, FREE)}
    peers = [a for n, p in ports.items() for a in ("--peer", f"{n}=http://127.0.0.1:{p}")]
    gateways = [
        Gateway(tmp_path, node, ports[node], *peers, "--model-url", f"{LM}={pod.url}",
                services=SERVICES)
        for node, pod in zip((FULL, FREE), pods, strict=True)
    ]  # fmt: skip
    origin = Gateway(tmp_path, "control", ports["control"], *peers, services=SERVICES)
    yield origin
    for gw in (origin, *gateways):
        gw.stop()
    for pod in pods:
        pod.stop()


def _server(node: str, kv: float, running: int, waiting: int) -> NodeState:
    ready = InstanceState(lm=LM, mode="gpu", cpu_cores=2, vgpus=1, status="ready")
    engine = EngineTelemetry(lm=LM, kv_cache_usage=kv, running=running, waiting=waiting)
    return NodeState(name=node, instances=[ready], engines=[engine])


def _push(gateway: Gateway, slot: int) -> httpx.Response:
    ctx = load_scenario(SCENARIO).context()
    update = RoutingUpdate(
        run=RUN,
        slot=slot,
        # the map, the last fallback: the LM to the full server
        routing=RoutingMap(routes=[Route(origin="control", lm=LM, destination=FULL)]),
        services={s.name: s.spec.modality for s in ctx.services},
        requests=RequestRouting(
            policy=PolicyConfig(profile="lyreo"),
            context=ctx,
            snapshot=Snapshot(
                slot=slot,
                time_s=0.0,
                nodes=[_server(FULL, 0.98, 128, 40), _server(FREE, 0.05, 2, 0)],
            ),
            window_s=0.5,
            budget_s=2.0,
        ),
    )
    headers = {"Authorization": f"Bearer {CONTROL}", "Content-Type": "application/json"}
    return httpx.put(
        gateway.url + "/control/routing",
        content=update.model_dump_json(),
        headers=headers,
        timeout=30,
    )


def test_lyreo_trained_policy_routes_requests_away_from_the_full_kv_pool(
    cluster: Gateway,
) -> None:
    origin = cluster
    assert shipped_policy("lyreo").is_file(), "the package ships LYREO's trained policy"
    assert _push(origin, 1).status_code == 200
    client = openai.OpenAI(base_url=origin.url + "/v1", api_key="unused", max_retries=0)

    def ask(stream: bool) -> str:
        messages: Any = [{"role": "user", "content": "hello"}]
        if stream:
            with client.chat.completions.with_streaming_response.create(
                model=LM, messages=messages, max_tokens=4, stream=True
            ) as raw:
                assert list(raw.parse()), "an empty stream"
                return raw.headers["x-lmedge-destination"]
        plain = client.chat.completions.with_raw_response.create(
            model=LM, messages=messages, max_tokens=4
        )
        assert plain.parse().model == LM
        return plain.headers["x-lmedge-destination"]

    def windows() -> dict[str, int]:
        headers = {"Authorization": f"Bearer {CONTROL}"}
        status = httpx.get(origin.url + "/control/status", headers=headers, timeout=10).json()
        return dict(status["windows"] or {})

    asked = 0
    deadline = time.monotonic() + 300  # generous: a loaded 2-core machine importing the catalog
    served: list[str] = []
    while time.monotonic() < deadline and (asked < 4 or windows().get("router", 0) < 2):
        served.append(ask(stream=asked % 2 == 1))
        asked += 1
    assert windows().get("router", 0) >= 2, windows()
    assert set(served) <= {FULL, FREE}

    assert origin.stop() in (0, -15), origin.log.read_text()
    # the learned router, not its `lyreo-ly` fallback (which says so once, as a warning)
    assert "no trained policy" not in origin.log.read_text()
    with open_store(str(origin.store), read_only=True) as store:
        records = {r.id: r for r in store.requests(RUN)}
        decisions = store.decisions(agent="scheduler", run=RUN, limit=1000)
    assert len(records) == asked and all(r.outcome == "success" for r in records.values())
    audits = [d.window for d in decisions if d.window is not None]
    assert sorted(a.request for w in audits for a in w.routes) == sorted(records)
    routed = [d for d in decisions if d.window is not None and d.window.used == "router"]
    assert routed, [d.error for d in decisions]
    for d in routed:
        assert d.policy == "lyreo" and d.source == "rule" and d.node == "control"
    seeded = [d for d in decisions if d.window is not None and d.window.used == "seed"]
    for d in routed + seeded:
        assert d.window is not None
        for a in d.window.routes:
            assert a.destination == FREE, d.window
            assert records[a.request].destination == FREE
