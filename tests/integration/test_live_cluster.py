"""The live cluster on the test API server (KWOK plays the kubelets): while the
controller and the node agents run, an LMService is applied, edited and
deleted, a Node is cordoned and marked NotReady, an EdgeNode is deleted — and
each change shows in the pods, the routing maps and the status within a few
slots, without a restart.

Everything is the production path: `run_controller` (leader election, the
loop, `KubernetesBackend` and its watch cache), `NodeAgent`s with the `full`
deployer (its placement depends on the node and the services only, so the
test knows which pods to expect), and the kopf operator writing status.
Slots are 1 s; the assertions wait a bounded number of seconds for a state
and never assert how fast it came.
"""

from __future__ import annotations

import concurrent.futures
import os
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from kopf.testing import KopfRunner
from kubernetes import client
from kubernetes.client.rest import ApiException

from lmedge.backends.kubernetes.client import KubeClient
from lmedge.backends.kubernetes.pods import parse_memory_gib
from lmedge.errors import LmedgeError
from lmedge.store import open_store
from tests.fixtures.cluster import KubeCluster, wait_until
from tests.fixtures.dataplane import TOKEN
from tests.integration.live_plane import (
    AGENT_NODES,
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

SLOT_S = 1.0


@pytest.fixture(scope="module")
def kube(lmedge_cluster: KubeCluster) -> Iterator[KubeClient]:
    k = KubeClient.connect(lmedge_cluster.kubeconfig)
    yield k
    k.close()


@pytest.fixture(scope="module")
def custom(kube: KubeClient) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(kube.api)


@pytest.fixture(scope="module")
def core(kube: KubeClient) -> client.CoreV1Api:
    return client.CoreV1Api(kube.api)


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("live-store") / "store"


@pytest.fixture(scope="module")
def operator(lmedge_cluster: KubeCluster, store_dir: Path) -> Iterator[KopfRunner]:
    try:
        lmedge_cluster.create_namespace(SYSTEM)
    except ApiException as exc:
        if exc.status != 409:
            raise
    keys = ("KUBECONFIG", "LMEDGE_STATUS_INTERVAL_S", "LMEDGE_STORE")
    saved = {k: os.environ.get(k) for k in keys}
    os.environ["KUBECONFIG"] = str(lmedge_cluster.kubeconfig)
    os.environ["LMEDGE_STATUS_INTERVAL_S"] = "1"
    os.environ["LMEDGE_STORE"] = str(store_dir)
    args = ["run", "--all-namespaces", "--standalone", "-m", "lmedge.operator.handlers"]
    try:
        with KopfRunner(args, timeout=60) as runner:
            yield runner
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture
def plane(
    lmedge_cluster: KubeCluster,
    operator: KopfRunner,
    kube: KubeClient,
    custom: client.CustomObjectsApi,
    store_dir: Path,
) -> Iterator[Plane]:
    """A namespace with lm1 and lm4, a controller and agents on worker-1/worker-2."""
    ns = lmedge_cluster.create_namespace(f"live-{uuid.uuid4().hex[:6]}")
    docs = services_yaml()
    for name in ("lm1", "lm4"):
        custom.create_namespaced_custom_object(GROUP, VERSION, ns, "lmservices", docs[name])
    store = open_store(str(store_dir))
    p = Plane(ns, f"live-{uuid.uuid4().hex[:6]}", store, store_dir, slot_s=SLOT_S)
    start_controller(p, kube, lease=f"live-{uuid.uuid4().hex[:6]}")
    start_agents(p, kube)
    try:
        yield p
    finally:
        p.close()
        store.close()
        client.CoreV1Api(kube.api).delete_namespace(ns)
    assert not p.errors, p.errors


def lmservice(custom: client.CustomObjectsApi, ns: str, name: str) -> dict[str, Any]:
    out: dict[str, Any] = custom.get_namespaced_custom_object(
        GROUP, VERSION, ns, "lmservices", name
    )
    return out


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c["type"] == kind:
            return dict(c)
    return {}


def test_an_applied_lmservice_is_routed_deployed_and_reported_without_a_restart(
    plane: Plane, core: client.CoreV1Api, custom: client.CustomObjectsApi
) -> None:
    wait_until(lambda: bool(model_pods(core, plane.namespace, "lm1")), WAIT, "lm1's pods")
    assert not any(lm == "lm5" for _, lm, _ in plane.routed())

    custom.create_namespaced_custom_object(GROUP, VERSION, plane.namespace, "lmservices", lm5())

    wait_until(
        lambda: any(lm == "lm5" for _, lm, _ in plane.routed()), WAIT, "a routing map naming lm5"
    )
    wait_until(
        lambda: (
            {p.spec.node_name for p in model_pods(core, plane.namespace, "lm5")} == set(AGENT_NODES)
        ),
        WAIT,
        "lm5's pods on both agents' nodes",
    )

    def replanned() -> bool:
        planned = plane.store.decisions(agent="planner", run=plane.run, limit=5)
        return any(d.slot > 0 and "lm5" in d.value.weights() for d in planned)

    # the planner runs beside the slot loop: its plan is stored when it is done
    wait_until(replanned, WAIT, "a plan for lm5 before the epoch's end")

    def ready() -> bool:
        return condition(lmservice(custom, plane.namespace, "lm5"), "Ready").get("status") == "True"

    wait_until(ready, WAIT, "lm5's Ready condition")

    def both() -> bool:
        status = lmservice(custom, plane.namespace, "lm5").get("status") or {}
        return bool(status.get("activeInstances") == len(AGENT_NODES))

    wait_until(both, WAIT, "lm5's status counting both instances")
    status = lmservice(custom, plane.namespace, "lm5")["status"]
    assert set(status["instancesPerNode"]) == set(AGENT_NODES)
    assert condition({"status": status}, "Unschedulable")["status"] == "False"
    assert status["observedGeneration"] == 1


def test_an_edited_lmservice_has_its_pods_replaced_and_a_deleted_one_stops(
    plane: Plane, core: client.CoreV1Api, custom: client.CustomObjectsApi
) -> None:
    custom.create_namespaced_custom_object(GROUP, VERSION, plane.namespace, "lmservices", lm5())
    wait_until(
        lambda: len(model_pods(core, plane.namespace, "lm5")) == len(AGENT_NODES),
        WAIT,
        "lm5's pods",
    )
    before = {p.metadata.name for p in model_pods(core, plane.namespace, "lm5")}

    custom.patch_namespaced_custom_object(
        GROUP, VERSION, plane.namespace, "lmservices", "lm5",
        {"spec": {"image": "ghcr.io/lmedge/model-server-gpt2:0.2.0", "deploymentMemoryGib": 4}},
    )  # fmt: skip

    def replaced() -> bool:
        pods = model_pods(core, plane.namespace, "lm5")
        images = {p.spec.containers[0].image for p in pods}
        names = {p.metadata.name for p in pods}
        return (
            len(pods) == len(AGENT_NODES)
            and images == {"ghcr.io/lmedge/model-server-gpt2:0.2.0"}
            and not names & before
        )

    wait_until(replaced, WAIT, "lm5's pods replaced by ones of the edited spec")
    pods = model_pods(core, plane.namespace, "lm5")
    memory = {parse_memory_gib(p.spec.containers[0].resources.requests["memory"]) for p in pods}
    assert memory == {4.0}

    custom.delete_namespaced_custom_object(GROUP, VERSION, plane.namespace, "lmservices", "lm5")

    wait_until(lambda: not model_pods(core, plane.namespace, "lm5"), WAIT, "lm5's pods to stop")
    wait_until(
        lambda: not any(lm == "lm5" for _, lm, _ in plane.routed()),
        WAIT,
        "routing maps without lm5",
    )
    assert model_pods(core, plane.namespace, "lm1"), "the other LMServices keep running"


def set_ready(core: client.CoreV1Api, node: str, ready: bool) -> None:
    """Take a Node from KWOK and set its Ready condition (a kubelet that stopped reporting)."""
    core.patch_node(node, {"metadata": {"annotations": {"kwok.x-k8s.io/node": None}}})
    body = {
        "status": {
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True" if ready else "False",
                    "reason": "KubeletReady" if ready else "KubeletNotReady",
                    "message": "test",
                }
            ]
        }
    }
    core.patch_node_status(node, body)


def give_back(core: client.CoreV1Api, node: str) -> None:
    core.patch_node(
        node,
        {
            "metadata": {"annotations": {"kwok.x-k8s.io/node": "fake"}},
            "spec": {"unschedulable": None},
        },
    )

    def ready() -> bool:
        conditions = core.read_node(node).status.conditions or []
        return any(c.type == "Ready" and c.status == "True" for c in conditions)

    set_ready(core, node, True)
    core.patch_node(node, {"metadata": {"annotations": {"kwok.x-k8s.io/node": "fake"}}})
    wait_until(ready, WAIT, f"{node} Ready again")


def edge_node(custom: client.CustomObjectsApi, name: str) -> dict[str, Any]:
    out: dict[str, Any] = custom.get_cluster_custom_object(GROUP, VERSION, "edgenodes", name)
    return out


def test_a_cordoned_or_notready_node_is_drained_and_routed_around(
    plane: Plane, core: client.CoreV1Api, custom: client.CustomObjectsApi
) -> None:
    wait_until(
        lambda: (
            {p.spec.node_name for p in model_pods(core, plane.namespace, "lm1")} == set(AGENT_NODES)
        ),
        WAIT,
        "lm1 on both agents' nodes",
    )
    try:
        core.patch_node("worker-2", {"spec": {"unschedulable": True}})

        wait_until(
            lambda: (
                not [p for p in model_pods(core, plane.namespace) if p.spec.node_name == "worker-2"]
            ),
            WAIT,
            "worker-2 drained",
        )
        wait_until(
            lambda: plane.routed() and not any("worker-2" in (o, d) for o, _, d in plane.routed()),
            WAIT,
            "routing maps without worker-2",
        )
        ready = condition(edge_node(custom, "worker-2"), "NodeReady")
        wait_until(
            lambda: (
                condition(edge_node(custom, "worker-2"), "NodeReady").get("reason") == "Cordoned"
            ),
            WAIT,
            "worker-2's NodeReady condition",
        )
        ready = condition(edge_node(custom, "worker-2"), "NodeReady")
        assert ready["status"] == "False" and "left out of routing" in ready["message"]
        decisions = plane.store.decisions(agent="deployer", run=plane.run, node="worker-2", limit=1)
        assert decisions and "cordoned" in (decisions[0].error or "")

        core.patch_node("worker-2", {"spec": {"unschedulable": None}})
        wait_until(
            lambda: any(p.spec.node_name == "worker-2" for p in model_pods(core, plane.namespace)),
            WAIT,
            "worker-2 serving again",
        )

        set_ready(core, "worker-1", False)
        wait_until(
            lambda: plane.routed() and not any("worker-1" in (o, d) for o, _, d in plane.routed()),
            WAIT,
            "routing maps without the NotReady worker-1",
        )
        wait_until(
            lambda: (
                condition(edge_node(custom, "worker-1"), "NodeReady").get("reason")
                == "NodeNotReady"
            ),
            WAIT,
            "worker-1's NodeReady condition",
        )
    finally:
        core.patch_node("worker-2", {"spec": {"unschedulable": None}})
        give_back(core, "worker-1")


def test_a_deleted_edge_node_leaves_the_routing_maps(
    plane: Plane, custom: client.CustomObjectsApi
) -> None:
    wait_until(
        lambda: any(d == "worker-4" for _, _, d in plane.routed()), WAIT, "routes to worker-4"
    )
    saved = edge_node(custom, "worker-4")
    try:
        custom.delete_cluster_custom_object(GROUP, VERSION, "edgenodes", "worker-4")
        wait_until(
            lambda: plane.routed() and not any("worker-4" in (o, d) for o, _, d in plane.routed()),
            WAIT,
            "routing maps without worker-4",
        )
    finally:
        restore_edge_node(custom, saved)
    wait_until(
        lambda: any(d == "worker-4" for _, _, d in plane.routed()), WAIT, "routes to worker-4 again"
    )


def submit(url: str, lm: str, rid: str) -> int:
    """POST one prompt set with id `rid`; the HTTP status (0: no answer at all)."""
    try:
        r = httpx.post(
            f"{url}/v1/prompt-sets",
            json={"lm": lm, "id": rid, "prompts": [{"text": "hi"}, {"text": "there"}]},
            headers={"Authorization": f"Bearer {TOKEN}"},
            timeout=60,
        )
    except httpx.HTTPError:
        return 0
    return r.status_code


def test_no_request_record_is_missing_when_a_node_and_an_lm_go_away(
    lmedge_cluster: KubeCluster,
    operator: KopfRunner,
    kube: KubeClient,
    core: client.CoreV1Api,
    custom: client.CustomObjectsApi,
    store_dir: Path,
    tmp_path: Path,
) -> None:
    """Requests keep arriving at both gateways while worker-2 goes NotReady and comes
    back, lm5 is deleted and worker-2's EdgeNode is deleted: every request a
    gateway accepted (answered with a status other than "unknown LM") has its
    record in the store, whatever its outcome (`node_lost` and `lm_removed`
    among the possible ones)."""
    ns = lmedge_cluster.create_namespace(f"live-{uuid.uuid4().hex[:6]}")
    docs = services_yaml()
    for doc in (docs["lm1"], lm5()):
        custom.create_namespaced_custom_object(GROUP, VERSION, ns, "lmservices", doc)
    store = open_store(str(store_dir))
    plane = Plane(ns, f"live-{uuid.uuid4().hex[:6]}", store, store_dir, slot_s=SLOT_S)
    plan_gateways(plane)
    start_data_plane(plane, kube, tmp_path, {"lm1": "text-to-text", "lm5": "text-to-text"})
    start_controller(plane, kube, lease=f"live-{uuid.uuid4().hex[:6]}")
    start_agents(plane, kube)
    saved = custom.get_cluster_custom_object(GROUP, VERSION, "edgenodes", "worker-2")
    sent: list[tuple[str, str, concurrent.futures.Future[int]]] = []
    pool = concurrent.futures.ThreadPoolExecutor(8)
    stop_load = concurrent.futures.Future[None]()

    def load() -> None:
        i = 0
        while not stop_load.done():
            for node, url in plane.gateways.items():
                for lm in ("lm1", "lm5"):
                    rid = f"r{i}-{node}-{lm}"
                    sent.append((node, rid, pool.submit(submit, url, lm, rid)))
            i += 1
            time.sleep(0.25)

    try:
        wait_until(
            lambda: {(o, lm) for o, lm, _ in plane.routed()} >= {("worker-1", "lm5")},
            WAIT,
            "a routing map for lm5",
        )
        loader = pool.submit(load)
        time.sleep(3 * SLOT_S)
        set_ready(core, "worker-2", False)
        time.sleep(3 * SLOT_S)
        give_back(core, "worker-2")
        time.sleep(3 * SLOT_S)
        custom.delete_namespaced_custom_object(GROUP, VERSION, ns, "lmservices", "lm5")
        time.sleep(3 * SLOT_S)
        custom.delete_cluster_custom_object(GROUP, VERSION, "edgenodes", "worker-2")
        time.sleep(3 * SLOT_S)
        stop_load.set_result(None)
        loader.result(60)
        statuses = {(node, rid): f.result(90) for node, rid, f in sent}
    finally:
        if not stop_load.done():
            stop_load.set_result(None)
        give_back(core, "worker-2")
        restore_edge_node(custom, saved)
        plane.close()  # gateways flush their records to the store on shutdown
        pool.shutdown(wait=True)
        core.delete_namespace(ns)
    accepted = {k for k, code in statuses.items() if code not in (0, 400, 404)}
    records = {(r.origin, r.id): r for r in store.requests(plane.run)}
    store.close()

    assert not plane.errors, plane.errors
    assert len(accepted) > 20, statuses  # the load did reach the gateways
    missing = sorted(accepted - set(records))
    assert missing == [], f"{len(missing)} of {len(accepted)} accepted requests have no record"
    outcomes = {r.outcome for r in records.values()}
    assert outcomes <= {"success", "timeout", "rejected", "node_lost", "lm_removed"}
    assert "success" in outcomes


def restore_edge_node(custom: client.CustomObjectsApi, saved: dict[str, Any]) -> None:
    body = {k: saved[k] for k in ("apiVersion", "kind", "spec")}
    body["metadata"] = {"name": saved["metadata"]["name"]}

    def recreated() -> bool:
        try:
            custom.create_cluster_custom_object(GROUP, VERSION, "edgenodes", body)
        except ApiException as exc:
            if exc.status == 409:  # still there, or still finalizing
                try:
                    now = custom.get_cluster_custom_object(
                        GROUP, VERSION, "edgenodes", body["metadata"]["name"]
                    )
                except ApiException:
                    return False
                return not now["metadata"].get("deletionTimestamp")
            raise
        return True

    wait_until(recreated, 3 * WAIT, f"EdgeNode {body['metadata']['name']} back")


def test_a_restarted_controller_resumes_the_run_with_its_stored_policy(
    lmedge_cluster: KubeCluster,
    operator: KopfRunner,
    kube: KubeClient,
    custom: client.CustomObjectsApi,
    store_dir: Path,
) -> None:
    """A controller stopped mid-epoch and a new replica taking over the same run:
    the run keeps its start (the agents' slot clock), the new replica goes on
    at the current slot, not at 0, and routes with the epoch's stored policy
    instead of planning again before the epoch ends."""
    ns = lmedge_cluster.create_namespace(f"live-{uuid.uuid4().hex[:6]}")
    custom.create_namespaced_custom_object(GROUP, VERSION, ns, "lmservices", services_yaml()["lm1"])
    store = open_store(str(store_dir))
    plane = Plane(ns, f"live-{uuid.uuid4().hex[:6]}", store, store_dir, slot_s=SLOT_S)
    lease = f"live-{uuid.uuid4().hex[:6]}"
    first = threading.Event()
    try:
        start_controller(plane, kube, lease, epoch_slots=1000, stop=first)

        def routed_slots() -> list[int]:
            try:
                found = store.decisions(agent="scheduler", run=plane.run, limit=50)
            except LmedgeError:  # nothing stored yet
                return []
            return sorted(d.slot for d in found)

        wait_until(lambda: len(routed_slots()) >= 3, WAIT, "three routed slots")
        (started,) = [r.started for r in store.runs(limit=5) if r.id == plane.run]
        first.set()  # the first replica goes away mid-epoch
        for t in plane.threads:
            t.join(30)
        stopped_at = max(routed_slots())

        start_controller(plane, kube, lease, epoch_slots=1000)
        wait_until(lambda: max(routed_slots()) >= stopped_at + 3, WAIT, "the new replica routing")
    finally:
        plane.close()
        client.CoreV1Api(kube.api).delete_namespace(ns)
    planned = store.decisions(agent="planner", run=plane.run, limit=10)
    (run,) = [r for r in store.runs(limit=5) if r.id == plane.run]
    slots = routed_slots()
    store.close()

    assert not plane.errors, plane.errors
    assert run.started == started  # the run's clock is the first replica's
    assert [d.slot for d in planned] == [0]  # one plan for the epoch, by the first replica
    resumed = [s for s in slots if s > stopped_at]
    assert resumed and min(resumed) > stopped_at  # on the same clock, not from slot 0 again
    assert len(slots) == len(set(slots))  # no slot routed twice
