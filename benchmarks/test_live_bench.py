"""Live-cluster benchmark (run by `make bench`): time from applying an LMService
to its first routed request. Target: at most one slot plus the cold start.

Setup (tests/integration/live_plane.py): the test API server with KWOK nodes,
`run_controller` (profile `ll`: local routing) and two node agents (worker-1,
worker-2; `full` deployer) in threads, a real gateway per agent node and stub model servers (0 s per
prompt), all on this machine's cores. KWOK turns a model pod Ready about a
second after it is created: that is the cold start here, measured per trial
from the pod's Ready condition (the API's 1 s resolution).

Each trial applies LMService `lm5`, then submits one prompt set for it to
worker-1's gateway every 0.1 s until one succeeds; `first_success_s` is the
time from the apply to that answer. `routable_s` is when the gateway first
accepted an `lm5` request at all (the first routing push naming it). The LM is
deleted between trials. Results are printed and written to
reports/bench-live.json.
"""

from __future__ import annotations

import json
import statistics
import time
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from kubernetes import client

from lmedge.backends.kubernetes.client import KubeClient
from lmedge.store import open_store
from tests.fixtures.cluster import KubeCluster, kube_cluster, lmedge_cluster, wait_until
from tests.fixtures.dataplane import TOKEN
from tests.integration.live_plane import (
    GROUP,
    SYSTEM,
    VERSION,
    WAIT,
    Plane,
    lm5,
    model_pods,
    plan_gateways,
    services_yaml,
    start_agents,
    start_controller,
    start_data_plane,
)

__all__ = ["kube_cluster", "lmedge_cluster"]  # the cluster fixtures, used here

pytestmark = pytest.mark.bench

ROOT = Path(__file__).resolve().parents[1]
SLOT_S = 2.0
TRIALS = 3


@pytest.fixture
def plane(lmedge_cluster: KubeCluster, tmp_path: Path) -> Iterator[tuple[Plane, KubeClient]]:
    kube = KubeClient.connect(lmedge_cluster.kubeconfig)
    try:
        lmedge_cluster.create_namespace(SYSTEM)
    except client.exceptions.ApiException as exc:
        if exc.status != 409:
            raise
    ns = lmedge_cluster.create_namespace(f"bench-{uuid.uuid4().hex[:6]}")
    custom = client.CustomObjectsApi(kube.api)
    custom.create_namespaced_custom_object(GROUP, VERSION, ns, "lmservices", services_yaml()["lm1"])
    store_dir = tmp_path / "store"
    store = open_store(str(store_dir))
    p = Plane(ns, f"bench-{uuid.uuid4().hex[:6]}", store, store_dir, slot_s=SLOT_S)
    plan_gateways(p)
    start_data_plane(p, kube, tmp_path, {"lm1": "text-to-text", "lm5": "text-to-text"})
    # local routing: the first request is served where it arrives, so the figure is
    # the live path's (watch, slot boundary, actuation, cold start), not a random
    # router's luck in picking one of the two nodes that run a gateway
    start_controller(p, kube, lease=f"bench-{uuid.uuid4().hex[:6]}", profile="ll")
    start_agents(p, kube)
    try:
        yield p, kube
    finally:
        p.close()
        store.close()
        client.CoreV1Api(kube.api).delete_namespace(ns)
        kube.close()


def _ready_after_s(pod: Any) -> float:
    """Seconds from the pod's creation to its Ready condition (1 s resolution)."""
    ready = next(c for c in pod.status.conditions if c.type == "Ready" and c.status == "True")
    created: datetime = pod.metadata.creation_timestamp
    return float((ready.last_transition_time - created).total_seconds())


def test_apply_to_first_routed_request(plane: tuple[Plane, KubeClient]) -> None:
    p, kube = plane
    custom, core = client.CustomObjectsApi(kube.api), client.CoreV1Api(kube.api)
    url = p.gateways["worker-1"]
    wait_until(lambda: any(lm == "lm1" for _, lm, _ in p.routed()), WAIT, "lm1 routed")
    trials: list[dict[str, float]] = []
    with httpx.Client(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30) as http:
        for trial in range(TRIALS):
            applied = time.monotonic()
            custom.create_namespaced_custom_object(GROUP, VERSION, p.namespace, "lmservices", lm5())
            routable: float | None = None
            first: float | None = None
            i = 0
            while first is None and time.monotonic() - applied < 120:
                body = {"lm": "lm5", "id": f"t{trial}-{i}", "prompts": [{"text": "x"}]}
                i += 1
                r = http.post(f"{url}/v1/prompt-sets", json=body)
                now = time.monotonic() - applied
                if r.status_code != 404 and routable is None:
                    routable = now
                if r.status_code == 200 and r.json()["outcome"] == "success":
                    first = now
                    break
                time.sleep(0.1)
            assert first is not None and routable is not None, "lm5 was never served"
            pods = [x for x in model_pods(core, p.namespace, "lm5") if x.status.conditions]
            cold = max((_ready_after_s(x) for x in pods), default=0.0)
            trials.append(
                {
                    "first_success_s": round(first, 2),
                    "routable_s": round(routable, 2),
                    "cold_start_s": cold,
                }
            )
            custom.delete_namespaced_custom_object(GROUP, VERSION, p.namespace, "lmservices", "lm5")
            wait_until(lambda: not model_pods(core, p.namespace, "lm5"), WAIT, "lm5 gone")
            wait_until(
                lambda: not any(lm == "lm5" for _, lm, _ in p.routed()), WAIT, "lm5 unrouted"
            )

            def refused() -> bool:
                body = {"lm": "lm5", "prompts": [{"text": "x"}]}
                return http.post(f"{url}/v1/prompt-sets", json=body).status_code == 404

            # the next trial starts from a gateway that does not serve lm5
            wait_until(refused, WAIT, "the gateway to refuse the deleted lm5")
    assert not p.errors, p.errors
    firsts = [t["first_success_s"] for t in trials]
    # Ready's time has 1 s resolution: the cold start is at most the difference + 1 s
    target = {i: SLOT_S + t["cold_start_s"] + 1.0 for i, t in enumerate(trials)}
    result = {
        "slot_s": SLOT_S,
        "trials": trials,
        "first_success_s": {"median": statistics.median(firsts), "max": max(firsts)},
        "target": "one slot + cold start",
        "target_met": all(t["first_success_s"] <= target[i] for i, t in enumerate(trials)),
    }
    out = ROOT / "reports" / "bench-live.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nlive benchmark -> {out}\n{json.dumps(result, indent=2)}")
    # What the design guarantees: the apply is seen at the next slot boundary,
    # or at the one after when the controller's step had already refreshed
    # (its store writes of the last slot delay the next step on a loaded
    # machine). The report says whether the tighter target held.
    for i, t in enumerate(trials):
        assert t["first_success_s"] <= target[i] + SLOT_S, result
