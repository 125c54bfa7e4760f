"""Request-level routing by the whole controller on the test API server (KWOK plays
the kubelets): `run_controller` with a per-request profile (LYREO's `lyreo`, the
package's trained actor; CEMA's `cema-request`) pushes each slot's map with
`RequestRouting` to real gateways (`live_plane`: `create_app` under uvicorn),
and the origin gateway routes the requests an `openai` client sends it in
windows, with the router built from the pushed policy.

The LM is examples/lyreo's `llama-1b` (a vLLM token engine) with a throughput
entry for the testbed's NVIDIA-A5000 (the RTX 3090's, an assumption: the
cluster's fake GPUs are the paper's A5000s), placed by the node agents' `full`
deployer on worker-2 and worker-3, each with a gateway and a stub model server
standing in for the pod. The origin is worker-2's gateway.

What the product guarantees, and what is asserted: every request is answered
and has its record in the store; every request is in exactly one window audit
(`Decision.window`, trigger `window`) of the origin, and its record went to
the destination its window named, a node with a pod of the LM; some windows
went by the profile's router itself. Windows that went by the fallback while
the router is still being built (LYREO's `ll-kv`, CEMA's load-aware seed) or by
the map are allowed, as in test_dataplane_lyreo_routing.py. Waits are bounded;
nothing asserts how fast.
"""

from __future__ import annotations

import copy
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml
from kopf.testing import KopfRunner
from kubernetes import client

from lmedge.backends.kubernetes.client import KubeClient
from lmedge.store import open_store
from tests.fixtures.cluster import REPO, KubeCluster, wait_until
from tests.fixtures.dataplane import CONTROL, TOKEN
from tests.integration.live_plane import (
    GROUP,
    VERSION,
    WAIT,
    Plane,
    model_pods,
    plan_gateways,
    start_agents,
    start_controller,
    start_data_plane,
)
from tests.integration.test_live_cluster import core, custom, kube, operator, store_dir

__all__ = ["core", "custom", "kube", "operator", "store_dir"]  # the module fixtures reused

LM = "llama-1b"
#: every GPU worker of examples/testbed/nodes.yaml (the LM's feasible nodes), each with
#: an agent and a gateway, as in a deployment: a router may choose any of them
NODES = tuple(f"worker-{i}" for i in range(2, 7))
ORIGIN = NODES[0]
#: seconds to keep asking for the router's windows: its first build imports the
#: policy catalog (and CEMA's compiles its kernel) on a loaded 2-core machine
PATIENCE = 300.0
#: requests sent at once (half of them streamed)
BURST = 4


def llama_1b() -> dict[str, Any]:
    """examples/lyreo's LMService, with the RTX 3090's token profile for the A5000."""
    (doc,) = [
        d
        for d in yaml.safe_load_all((REPO / "examples/lyreo/services.yaml").read_text())
        if d and d["metadata"]["name"] == LM
    ]
    doc = copy.deepcopy(doc)
    gpus = doc["spec"]["engine"]["tokens"]["gpus"]
    (rtx3090,) = [g for g in gpus if g["gpuModel"] == "NVIDIA-RTX-3090"]
    gpus.append({**rtx3090, "gpuModel": "NVIDIA-A5000"})
    return dict(doc)


@pytest.fixture(params=["lyreo", "cema-request"])
def plane(
    request: pytest.FixtureRequest,
    lmedge_cluster: KubeCluster,
    operator: KopfRunner,
    kube: KubeClient,
    custom: client.CustomObjectsApi,
    store_dir: Path,
    tmp_path: Path,
) -> Iterator[Plane]:
    """The LM applied in a fresh namespace; gateways, stub pods, agents and the
    controller with the profile `request.param`."""
    ns = lmedge_cluster.create_namespace(f"live-rr-{uuid.uuid4().hex[:6]}")
    custom.create_namespaced_custom_object(GROUP, VERSION, ns, "lmservices", llama_1b())
    store = open_store(str(store_dir))
    p = Plane(ns, f"live-rr-{uuid.uuid4().hex[:6]}", store, store_dir, nodes=NODES)
    try:
        plan_gateways(p)
        start_data_plane(p, kube, tmp_path, {LM: "text-to-text"})
        start_controller(p, kube, lease=f"live-rr-{uuid.uuid4().hex[:6]}", profile=request.param)
        start_agents(p, kube)
        yield p
    finally:
        p.close()  # the gateways write their windows and records to the store on shutdown
        store.close()
        client.CoreV1Api(kube.api).delete_namespace(ns)
    assert not p.errors, p.errors


def windows(url: str) -> dict[str, int]:
    """The gateway's window counts: decided, and by the router, the seed, the map."""
    headers = {"Authorization": f"Bearer {CONTROL}"}
    status = httpx.get(url + "/control/status", headers=headers, timeout=10).json()
    return dict(status.get("windows") or {})


def test_the_controller_routes_each_request_with_the_profiles_router(
    plane: Plane, core: client.CoreV1Api, caplog: pytest.LogCaptureFixture
) -> None:
    profile = plane_profile(plane)

    def ready() -> bool:
        pods = model_pods(core, plane.namespace, LM)
        up = {
            p.spec.node_name
            for p in pods
            if any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])
        }
        return up >= set(NODES)

    wait_until(ready, WAIT, f"{LM}'s pods Ready on {', '.join(NODES)}")
    origin = plane.gateways[ORIGIN]
    # the controller's pushes carry RequestRouting: the origin routes in windows
    wait_until(lambda: "windows" in windows(origin), WAIT, "the origin to route in windows")

    sdk = openai.OpenAI(base_url=origin + "/v1", api_key=TOKEN, max_retries=0, timeout=120.0)

    def ask(stream: bool) -> tuple[str, str]:
        """(request id, destination) of one answered request."""
        messages: Any = [{"role": "user", "content": "hello"}]
        if stream:
            with sdk.chat.completions.with_streaming_response.create(
                model=LM, messages=messages, max_tokens=4, stream=True
            ) as raw:
                assert list(raw.parse()), "an empty stream"
                return raw.headers["x-lmedge-request-id"], raw.headers["x-lmedge-destination"]
        plain = sdk.chat.completions.with_raw_response.create(
            model=LM, messages=messages, max_tokens=4
        )
        assert plain.parse().model == LM
        return plain.headers["x-lmedge-request-id"], plain.headers["x-lmedge-destination"]

    served: dict[str, str] = {}
    deadline = time.monotonic() + PATIENCE
    with ThreadPoolExecutor(BURST) as pool:
        # bursts, so that a window holds several requests for the router to spread
        while time.monotonic() < deadline and (
            len(served) < 2 * BURST or windows(origin).get("router", 0) < 2
        ):
            served.update(pool.map(ask, [i % 2 == 1 for i in range(BURST)]))
    assert windows(origin).get("router", 0) >= 2, windows(origin)
    assert set(served.values()) <= set(NODES), served

    plane.close()  # the gateways flush their records and window audits
    records = {r.id: r for r in plane.store.requests(plane.run) if r.origin == ORIGIN}
    audits = [
        d
        for d in plane.store.decisions(agent="scheduler", run=plane.run, limit=10_000)
        if d.window is not None
    ]
    # none lost: every request answered has its record, with the destination it was told
    assert set(records) == set(served), (sorted(served), sorted(records))
    assert all(r.outcome == "success" for r in records.values())
    assert {rid: r.destination for rid, r in records.items()} == served
    # every request in exactly one window of the origin, and sent where it said
    routed = [(a.request, a.destination) for d in audits for a in d.window.routes]  # type: ignore[union-attr]
    assert sorted(rid for rid, _ in routed) == sorted(served)
    assert all(served[rid] == destination for rid, destination in routed)
    for d in audits:
        assert d.node == ORIGIN and d.trigger == "window" and d.policy == profile
    by_router = [d for d in audits if d.window is not None and d.window.used == "router"]
    assert len(by_router) >= 2, [d.error for d in audits]
    assert all(d.source == "rule" and d.error is None for d in by_router)
    # LYREO's learned router, not its `lyreo-ly` fallback (which says so, as a warning)
    assert "no trained policy" not in caplog.text


def plane_profile(plane: Plane) -> str:
    """The profile the controller runs (the one the run stored)."""
    wait_until(lambda: any(r.id == plane.run for r in plane.store.runs(limit=5)), WAIT, "the run")
    (run,) = [r for r in plane.store.runs(limit=5) if r.id == plane.run]
    return run.policy
