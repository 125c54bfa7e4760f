"""The kopf operator (`lmedge.operator.handlers`) run with `kopf.testing.KopfRunner`
against the test API server: EdgeNodes label their Nodes and render the
time-slicing ConfigMap, mismatches and missing Nodes become status and events,
deletion cleans up through the finalizer, LMServices get their status.

One operator runs for the whole module (it takes seconds to start); tests
restore what they change on cluster-scoped objects.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kopf.testing import KopfRunner
from kubernetes import client
from kubernetes.client.rest import ApiException

from lmedge.api import LMPlacement, LMServiceSpec, LoopConstants, ServiceInfo
from lmedge.backends.kubernetes.backend import KubernetesSettings
from lmedge.backends.kubernetes.client import KubeClient
from lmedge.backends.kubernetes.leader import LeaseElector
from lmedge.backends.kubernetes.pods import model_pod
from lmedge.controller.assembly import PolicyChoice
from lmedge.processes.controller import ControllerSettings, run_controller
from lmedge.store import open_store
from tests.fixtures.cluster import REPO, KubeCluster, wait_until

GROUP, VERSION = "lmedge.io", "v1alpha1"
SYSTEM = "lmedge-system"
CONFIGMAP = "lmedge-time-slicing"
WAIT = 30.0
DEVICE_PLUGIN_LABEL = "nvidia.com/device-plugin.config"


@pytest.fixture(scope="module")
def operator(lmedge_cluster: KubeCluster) -> Iterator[KopfRunner]:
    try:
        lmedge_cluster.create_namespace(SYSTEM)
    except ApiException as exc:
        if exc.status != 409:
            raise
    saved = {k: os.environ.get(k) for k in ("KUBECONFIG", "LMEDGE_STATUS_INTERVAL_S")}
    os.environ["KUBECONFIG"] = str(lmedge_cluster.kubeconfig)
    os.environ["LMEDGE_STATUS_INTERVAL_S"] = "1"
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
    assert runner.exception is None, runner.output


@pytest.fixture(scope="module")
def api(lmedge_cluster: KubeCluster) -> Iterator[Any]:
    with lmedge_cluster.api_client() as a:
        yield a


@pytest.fixture(scope="module")
def core(api: Any) -> client.CoreV1Api:
    return client.CoreV1Api(api)


@pytest.fixture(scope="module")
def custom(api: Any) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(api)


def edge_node(custom: client.CustomObjectsApi, name: str) -> dict[str, Any]:
    out: dict[str, Any] = custom.get_cluster_custom_object(GROUP, VERSION, "edgenodes", name)
    return out


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c["type"] == kind:
            return dict(c)
    return None


def events_for(core: client.CoreV1Api, name: str, reason: str) -> list[str]:
    found = core.list_event_for_all_namespaces(field_selector=f"involvedObject.name={name}")
    return [e.message for e in found.items if e.reason == reason]


def test_edge_nodes_label_their_nodes(operator: KopfRunner, core: client.CoreV1Api) -> None:
    def labelled() -> bool:
        labels = core.read_node("worker-6").metadata.labels or {}
        return labels.get("lmedge.io/edge-node") == "true"

    wait_until(labelled, WAIT, "worker-6 labelled by the operator")
    w6 = core.read_node("worker-6").metadata.labels
    w1 = core.read_node("worker-1").metadata.labels
    assert (w6["lmedge.io/role"], w6["lmedge.io/gpu"], w6[DEVICE_PLUGIN_LABEL]) == (
        "worker", "true", "lmedge-replicas-2",
    )  # fmt: skip
    wait_until(lambda: "lmedge.io/gpu" in (core.read_node("worker-1").metadata.labels or {}),
               WAIT, "worker-1 labelled")  # fmt: skip
    w1 = core.read_node("worker-1").metadata.labels
    assert w1["lmedge.io/gpu"] == "false"
    assert DEVICE_PLUGIN_LABEL not in w1


def test_time_slicing_configmap_has_replicas_per_gpu(
    operator: KopfRunner, core: client.CoreV1Api
) -> None:
    def rendered() -> bool:
        try:
            return bool(core.read_namespaced_config_map(CONFIGMAP, SYSTEM).data)
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise

    wait_until(rendered, WAIT, "the time-slicing ConfigMap")
    data = core.read_namespaced_config_map(CONFIGMAP, SYSTEM).data
    assert sorted(data) == ["lmedge-replicas-2"]
    config = yaml.safe_load(data["lmedge-replicas-2"])
    assert config["sharing"]["timeSlicing"]["resources"] == [
        {"name": "nvidia.com/gpu", "replicas": 2}
    ]


def test_edge_node_status_and_printer_columns(
    operator: KopfRunner, custom: client.CustomObjectsApi
) -> None:
    def reconciled() -> bool:
        c = condition(edge_node(custom, "worker-6"), "CapacityMatches")
        return c is not None and c["status"] == "True"

    wait_until(reconciled, WAIT, "worker-6 CapacityMatches")
    status = edge_node(custom, "worker-6")["status"]
    assert (status["gpus"], status["vgpus"]) == (2, 4)


def test_capacity_mismatch_is_reported_in_status_and_events(
    operator: KopfRunner, custom: client.CustomObjectsApi, core: client.CoreV1Api
) -> None:
    original = edge_node(custom, "worker-3")["spec"]["cpuCores"]
    custom.patch_cluster_custom_object(
        GROUP, VERSION, "edgenodes", "worker-3", {"spec": {"cpuCores": 64}}
    )
    try:

        def mismatch() -> bool:
            c = condition(edge_node(custom, "worker-3"), "CapacityMatches")
            return c is not None and c["status"] == "False"

        wait_until(mismatch, WAIT, "worker-3 CapacityMatches=False")
        c = condition(edge_node(custom, "worker-3"), "CapacityMatches")
        assert c is not None
        assert c["reason"] == "AllocatableMismatch"
        assert "spec.cpuCores=64 but the Node allocates 16 CPU" in c["message"]
        wait_until(lambda: bool(events_for(core, "worker-3", "CapacityMismatch")), WAIT,
                   "a CapacityMismatch event")  # fmt: skip
    finally:
        custom.patch_cluster_custom_object(
            GROUP, VERSION, "edgenodes", "worker-3", {"spec": {"cpuCores": original}}
        )

    def fixed() -> bool:
        c = condition(edge_node(custom, "worker-3"), "CapacityMatches")
        return c is not None and c["status"] == "True"

    wait_until(fixed, WAIT, "worker-3 CapacityMatches=True again")


def test_edge_node_without_a_node_gets_an_event(
    operator: KopfRunner, core: client.CoreV1Api
) -> None:
    # examples/testbed has a `control` EdgeNode, and the test cluster no such Node.
    wait_until(lambda: bool(events_for(core, "control", "NodeMissing")), WAIT,
               "a NodeMissing event for control")  # fmt: skip
    assert events_for(core, "control", "NodeMissing")[0] == "no Node named control"


def test_deleting_an_edge_node_unlabels_its_node(
    operator: KopfRunner, custom: client.CustomObjectsApi, core: client.CoreV1Api
) -> None:
    saved = edge_node(custom, "worker-1")
    wait_until(lambda: "lmedge.io/role" in (core.read_node("worker-1").metadata.labels or {}),
               WAIT, "worker-1 labelled")  # fmt: skip

    custom.delete_cluster_custom_object(GROUP, VERSION, "edgenodes", "worker-1")

    def gone() -> bool:
        try:
            edge_node(custom, "worker-1")
        except ApiException as exc:
            return exc.status == 404
        return False

    wait_until(gone, WAIT, "the EdgeNode deleted past its finalizer")
    assert "lmedge.io/role" not in (core.read_node("worker-1").metadata.labels or {})
    restored = {k: saved[k] for k in ("apiVersion", "kind", "spec")}
    restored["metadata"] = {"name": "worker-1"}
    custom.create_cluster_custom_object(GROUP, VERSION, "edgenodes", restored)
    wait_until(lambda: "lmedge.io/role" in (core.read_node("worker-1").metadata.labels or {}),
               WAIT, "worker-1 labelled again")  # fmt: skip


def test_lmservice_status_counts_ready_instances_per_node(
    operator: KopfRunner, lmedge_cluster: KubeCluster, custom: client.CustomObjectsApi,
    core: client.CoreV1Api,
) -> None:  # fmt: skip
    ns = lmedge_cluster.create_namespace(f"op-{uuid.uuid4().hex[:6]}")
    docs = [
        d for d in yaml.safe_load_all((REPO / "examples/testbed/services.yaml").read_text()) if d
    ]
    lm2 = next(d for d in docs if d["metadata"]["name"] == "lm2")
    made = custom.create_namespaced_custom_object(GROUP, VERSION, ns, "lmservices", lm2)
    service = ServiceInfo(name="lm2", spec=LMServiceSpec.model_validate(lm2["spec"]))
    for node in ("worker-4", "worker-5"):
        placement = LMPlacement(lm="lm2", mode="gpu", cpu_cores=2, vgpus=1)
        core.create_namespaced_pod(
            ns, model_pod(service, placement, node, ns, owner_uid=made["metadata"]["uid"])
        )

    def counted() -> bool:
        obj = custom.get_namespaced_custom_object(GROUP, VERSION, ns, "lmservices", "lm2")
        return (obj.get("status") or {}).get("activeInstances") == 2

    try:
        wait_until(counted, WAIT, "lm2 status.activeInstances == 2")
        obj = custom.get_namespaced_custom_object(GROUP, VERSION, ns, "lmservices", "lm2")
        assert obj["status"]["instancesPerNode"] == {"worker-4": 1, "worker-5": 1}
        valid = condition(obj, "Valid")
        assert valid is not None and valid["status"] == "True"
    finally:
        core.delete_namespace(ns)


# -- the controller process: leader election gating the loop ---------------------


@pytest.fixture
def kube(lmedge_cluster: KubeCluster) -> Iterator[KubeClient]:
    k = KubeClient.connect(lmedge_cluster.kubeconfig)
    yield k
    k.close()


def test_only_one_elector_leads_and_a_released_lease_passes_on(
    operator: KopfRunner, kube: KubeClient
) -> None:
    name = f"lease-{uuid.uuid4().hex[:6]}"
    first = LeaseElector(kube, SYSTEM, name, "first", duration_s=3, renew_s=1)
    second = LeaseElector(kube, SYSTEM, name, "second", duration_s=3, renew_s=1)

    assert first.acquire()
    assert second.try_acquire() is False
    time.sleep(2)  # renewals keep it
    assert second.try_acquire() is False
    first.release()

    assert second.try_acquire() is True
    lease = kube.read_lease(SYSTEM, name)
    assert lease is not None
    assert lease["spec"]["holderIdentity"] == "second"
    assert lease["spec"]["leaseTransitions"] == 2


def test_an_expired_lease_is_taken_over(operator: KopfRunner, kube: KubeClient) -> None:
    name = f"lease-{uuid.uuid4().hex[:6]}"
    crashed = LeaseElector(kube, SYSTEM, name, "crashed", duration_s=2)
    assert crashed.try_acquire()  # and never renews: the replica died
    standby = LeaseElector(kube, SYSTEM, name, "standby", duration_s=2)

    assert standby.try_acquire() is False
    time.sleep(2.5)

    assert standby.try_acquire() is True


def test_controller_leads_runs_planner_and_router_and_hands_back_the_lease(
    operator: KopfRunner, lmedge_cluster: KubeCluster, kube: KubeClient, tmp_path: Path
) -> None:
    ns = lmedge_cluster.create_namespace(f"ctl-{uuid.uuid4().hex[:6]}")
    custom = client.CustomObjectsApi(kube.api)
    for doc in yaml.safe_load_all((REPO / "examples/testbed/services.yaml").read_text()):
        if doc:
            custom.create_namespaced_custom_object(GROUP, VERSION, ns, "lmservices", doc)
    lease = f"ctl-{uuid.uuid4().hex[:6]}"
    settings = ControllerSettings(
        backend=KubernetesSettings(
            namespace=ns, loop=LoopConstants(slot_s=0.5, epoch_slots=2), run="ctl-test"
        ),
        policy=PolicyChoice(profile="rr"),
        lease_namespace=SYSTEM,
        lease_name=lease,
        identity="replica-a",
        slots=3,
        operator=False,  # the module's KopfRunner already operates
    )
    store = open_store(str(tmp_path / "store"))
    held: list[str] = []

    def during(slot: int) -> None:
        got = kube.read_lease(SYSTEM, lease)
        held.append((got or {}).get("spec", {}).get("holderIdentity", ""))

    try:
        code = run_controller(settings, kube, store, on_slot=during)
        planned = store.decisions(agent="planner", run="ctl-test", limit=10)
        routed = store.decisions(agent="scheduler", run="ctl-test", limit=10)
        deployed = store.decisions(agent="deployer", run="ctl-test", limit=10)
        run = store.runs(limit=1)[0]
    finally:
        store.close()

    assert code == 0
    assert held == ["replica-a"] * 3
    assert sorted(d.slot for d in planned) == [0, 2]  # epochs of two slots
    assert sorted(d.slot for d in routed) == [0, 1, 2]
    assert deployed == []  # deployers are the node agents' job
    assert (run.id, run.backend) == ("ctl-test", "kubernetes")
    pairs = {(r.origin, r.lm) for r in routed[0].value.routes}
    assert ("worker-1", "lm1") in pairs
    assert (kube.read_lease(SYSTEM, lease) or {})["spec"].get("holderIdentity") in ("", None)
