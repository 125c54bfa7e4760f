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

import copy
import os
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC
from pathlib import Path
from typing import Any

import pytest
import yaml
from kopf.testing import KopfRunner
from kubernetes import client
from kubernetes.client.rest import ApiException

from lmedge.api import RoutingMap
from lmedge.backends.kubernetes.backend import KubernetesBackend, KubernetesSettings, WallClock
from lmedge.backends.kubernetes.client import KubeClient
from lmedge.backends.kubernetes.pods import LABEL_LM, parse_memory_gib
from lmedge.controller.assembly import PolicyChoice
from lmedge.controller.catalog import BuildContext, build_deployer
from lmedge.errors import StoreError
from lmedge.nodeagent.agent import NodeAgent
from lmedge.operator.process import ControllerSettings, run_controller
from lmedge.store import Store, open_store
from tests.fixtures.cluster import REPO, KubeCluster, wait_until

GROUP, VERSION = "lmedge.io", "v1alpha1"
SYSTEM = "lmedge-system"
SLOT_S = 1.0
WAIT = 45.0  # seconds for a change to show; dozens of slots on a loaded machine
AGENT_NODES = ("worker-1", "worker-2")


def services_yaml() -> dict[str, dict[str, Any]]:
    docs = yaml.safe_load_all((REPO / "examples/testbed/services.yaml").read_text())
    return {d["metadata"]["name"]: d for d in docs if d}


def lm5() -> dict[str, Any]:
    """A new text LMService: lm1's spec under another name."""
    doc = copy.deepcopy(services_yaml()["lm1"])
    doc["metadata"] = {"name": "lm5"}
    doc["spec"]["serves"] = []
    return doc


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


@dataclass
class Plane:
    """The controller and node agents of one run, in threads of this process."""

    namespace: str
    run: str
    store: Store
    stop: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)
    errors: list[BaseException] = field(default_factory=list)

    def spawn(self, target: Any, name: str) -> None:
        def guarded() -> None:
            try:
                target()
            except BaseException as exc:  # reported by the test's teardown
                self.errors.append(exc)

        t = threading.Thread(target=guarded, name=name, daemon=True)
        t.start()
        self.threads.append(t)

    def routing(self) -> RoutingMap | None:
        found = self.store.decisions(agent="scheduler", run=self.run, limit=1)
        value = found[0].value if found else None
        return value if isinstance(value, RoutingMap) else None

    def routed(self) -> set[tuple[str, str, str]]:
        """(origin, lm, destination) of the newest routing map."""
        r = self.routing()
        return {(x.origin, x.lm, x.destination) for x in r.routes} if r else set()


def start_controller(plane: Plane, kube: KubeClient, store_dir: Path, lease: str) -> None:
    settings = ControllerSettings(
        backend=KubernetesSettings(
            namespace=plane.namespace, slot_s=SLOT_S, epoch_slots=30, run=plane.run
        ),
        policy=PolicyChoice(profile="rf"),
        lease_namespace=SYSTEM,
        lease_name=lease,
        identity=f"replica-{uuid.uuid4().hex[:4]}",
        operator=False,  # the module's KopfRunner operates
        lease_duration_s=6.0,
    )

    def controller() -> None:
        store = open_store(str(store_dir))
        try:
            run_controller(settings, kube, store, stop=plane.stop)
        finally:
            store.close()

    plane.spawn(controller, "controller")


def start_agents(plane: Plane, kube: KubeClient, store_dir: Path) -> None:
    def started() -> bool:
        try:
            return any(r.id == plane.run for r in plane.store.runs(limit=5))
        except StoreError:  # nothing stored yet
            return False

    wait_until(started, WAIT, f"the controller to store run {plane.run}")
    (run,) = [r for r in plane.store.runs(limit=5) if r.id == plane.run]
    start = run.started.replace(tzinfo=UTC).timestamp()
    for node in AGENT_NODES:

        def agent(node: str = node) -> None:
            store = open_store(str(store_dir))
            backend = KubernetesBackend(
                kube,
                KubernetesSettings(namespace=plane.namespace, slot_s=SLOT_S, run=plane.run),
                store=store,
                clock=WallClock(start),
            )
            deployer = build_deployer("full", BuildContext(backend.context(), 0))
            try:
                NodeAgent(node, backend, deployer, store=store).run(stop=plane.stop)
            finally:
                backend.close()
                store.close()

        plane.spawn(agent, f"agent-{node}")


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
    p = Plane(namespace=ns, run=f"live-{uuid.uuid4().hex[:6]}", store=store)
    start_controller(p, kube, store_dir, lease=f"live-{uuid.uuid4().hex[:6]}")
    start_agents(p, kube, store_dir)
    try:
        yield p
    finally:
        p.stop.set()
        for t in p.threads:
            t.join(30)
        store.close()
        client.CoreV1Api(kube.api).delete_namespace(ns)
    assert not p.errors, p.errors


def model_pods(core: client.CoreV1Api, ns: str, lm: str | None = None) -> list[Any]:
    selector = f"{LABEL_LM}={lm}" if lm else LABEL_LM
    pods = core.list_namespaced_pod(ns, label_selector=selector).items
    return [p for p in pods if p.metadata.deletion_timestamp is None]


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
    planned = plane.store.decisions(agent="planner", run=plane.run, limit=5)
    assert any(d.slot > 0 for d in planned), "the new LMService made the planner re-plan"
    assert any("lm5" in d.value.weights() for d in planned if d.slot > 0)

    def ready() -> bool:
        return condition(lmservice(custom, plane.namespace, "lm5"), "Ready").get("status") == "True"

    wait_until(ready, WAIT, "lm5's Ready condition")
    status = lmservice(custom, plane.namespace, "lm5")["status"]
    assert status["activeInstances"] == len(AGENT_NODES)
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
        body = {k: saved[k] for k in ("apiVersion", "kind", "spec")}
        body["metadata"] = {"name": "worker-4"}

        def recreated() -> bool:
            try:
                custom.create_cluster_custom_object(GROUP, VERSION, "edgenodes", body)
            except ApiException as exc:
                if exc.status == 409:  # still finalizing
                    return False
                raise
            return True

        wait_until(recreated, WAIT, "worker-4's EdgeNode re-created")
    wait_until(
        lambda: any(d == "worker-4" for _, _, d in plane.routed()), WAIT, "routes to worker-4 again"
    )
