"""Request-level routing through real `lmedge gateway` processes: `cema-request` per request.

examples/model-routing: lm1 (small) and lm2 (large) serve the request class
`text-generation`; worker-2's gateway has stub pods of both, worker-1's none.
The push to worker-1 carries `RequestRouting` (the `cema-request` profile,
the scenario's context, a snapshot with lm1 and lm2 ready on worker-2), as
the controller's cluster backend sends it: worker-1's gateway builds CEMA's
request router from the plugin catalog and routes every request in 0.5-s
windows, one gene per request, through the OpenAI API (plain and streamed).
Every request is served (none lost while the router is built and its kernel
compiles: those windows go by the seed or the map), and each window is one
`Decision` in worker-1's store, whose window routes are the records' routes.
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
from lmedge.api.gateway_control import RequestRouting, RoutingUpdate
from lmedge.api.runconfig import PolicyConfig
from lmedge.sim.scenario import load_scenario
from lmedge.store import open_store
from tests.fixtures.dataplane import ServerThread, free_port, model_server
from tests.integration.test_dataplane_model_routing import CLASS, CONTROL, REPO, RUN, Gateway

SCENARIO = REPO / "examples" / "model-routing"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[Gateway, Gateway, list[ServerThread]]]:
    pods = [model_server(lm, tmp_path, seconds=0.01) for lm in ("lm1", "lm2")]
    p1, p2 = free_port(), free_port()
    peers = [
        "--peer", f"worker-1=http://127.0.0.1:{p1}", "--peer", f"worker-2=http://127.0.0.1:{p2}",
    ]  # fmt: skip
    models = ["--model-url", f"lm1={pods[0].url}", "--model-url", f"lm2={pods[1].url}"]
    dest = Gateway(tmp_path, "worker-2", p2, *peers, *models)
    origin = Gateway(tmp_path, "worker-1", p1, *peers)
    yield origin, dest, pods
    for gw in (origin, dest):
        gw.stop()
    for pod in pods:
        pod.stop()


def _push(gateway: Gateway, slot: int) -> httpx.Response:
    ctx = load_scenario(SCENARIO).context()
    ready = [
        InstanceState(lm=lm, mode="cpu", cpu_cores=1, vgpus=0, status="ready")
        for lm in ("lm1", "lm2")
    ]
    update = RoutingUpdate(
        run=RUN,
        slot=slot,
        # the map, the last fallback: the class to lm1 at worker-2
        routing=RoutingMap(
            routes=[Route(origin="worker-1", lm=CLASS, destination="worker-2", model="lm1")]
        ),
        services={s.name: s.spec.modality for s in ctx.services},
        classes={CLASS: ["lm1", "lm2"]},
        requests=RequestRouting(
            policy=PolicyConfig(profile="cema-request", params={"router": {"generations": 5}}),
            context=ctx,
            snapshot=Snapshot(
                slot=slot,
                time_s=0.0,
                nodes=[NodeState(name="worker-2", instances=ready)],
            ),
            window_s=0.5,
            budget_s=2.0,
        ),
    )
    headers = {"Authorization": f"Bearer {CONTROL}"}
    return httpx.put(
        gateway.url + "/control/routing",
        content=update.model_dump_json(),
        headers={**headers, "Content-Type": "application/json"},
        timeout=30,
    )


def test_cema_request_routes_each_request_at_the_gateway_with_window_decisions_stored(
    cluster: tuple[Gateway, Gateway, list[ServerThread]],
) -> None:
    origin, _, _ = cluster
    assert _push(origin, 1).status_code == 200
    client = openai.OpenAI(base_url=origin.url + "/v1", api_key="unused", max_retries=0)

    def ask(stream: bool) -> tuple[str, str]:
        messages: Any = [{"role": "user", "content": "hello"}]
        if stream:
            with client.chat.completions.with_streaming_response.create(
                model=CLASS, messages=messages, max_tokens=4, stream=True
            ) as raw:
                pieces = list(raw.parse())
                assert pieces, "an empty stream"
                return raw.headers["x-lmedge-destination"], raw.headers["x-lmedge-model"]
        raw = client.chat.completions.with_raw_response.create(
            model=CLASS, messages=messages, max_tokens=4
        )
        chat = raw.parse()
        return raw.headers["x-lmedge-destination"], chat.model

    # Until the router is built and warm (the catalog's imports, the kernel's compile),
    # windows go by the seed or the map; every request is still served.
    def windows() -> dict[str, int]:
        headers = {"Authorization": f"Bearer {CONTROL}"}
        status = httpx.get(origin.url + "/control/status", headers=headers, timeout=10).json()
        return dict(status["windows"] or {})

    asked = 0
    deadline = time.monotonic() + 300  # generous: a loaded 2-core machine compiling numba
    served: list[tuple[str, str]] = []
    while time.monotonic() < deadline and (asked < 4 or windows().get("router", 0) < 2):
        served.append(ask(stream=asked % 2 == 1))
        asked += 1
    assert windows().get("router", 0) >= 2, windows()
    assert all(dest == "worker-2" and model in ("lm1", "lm2") for dest, model in served)

    assert origin.stop() in (0, -15), origin.log.read_text()
    with open_store(str(origin.store), read_only=True) as store:
        records = list(store.requests(RUN))
        decisions = store.decisions(agent="scheduler", run=RUN, limit=1000)
    assert len(records) == asked and all(r.outcome == "success" for r in records)
    windows = [d for d in decisions if d.window is not None]
    assert windows and all(d.node == "worker-1" and d.trigger == "window" for d in windows)
    # each request is in exactly one window, and went where that window sent it
    assigned = {a.request: a for d in windows if d.window for a in d.window.routes}
    assert sorted(assigned) == sorted(r.id for r in records)
    by_id = {r.id: r for r in records}
    for rid, a in assigned.items():
        assert (by_id[rid].destination, by_id[rid].model) == (a.destination, a.model)
    routed = [d for d in windows if d.window is not None and d.window.used == "router"]
    assert routed, [d.error for d in windows]
    for d in routed:
        assert d.window is not None and d.window.j is not None and d.window.seed_j is not None
        assert d.source == "rule" and d.policy == "cema-request"
