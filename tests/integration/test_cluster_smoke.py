"""The test cluster itself: the things the operator tests rely on actually work.

Each test runs in its own namespace against the session ``kube_cluster``.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.fixtures.cluster import (
    GPU_RESOURCE,
    TESTBED_WORKERS,
    KubeCluster,
    tools_dir,
    wait_until,
)

WAIT = 60.0  # seconds; KWOK's fast stages act in well under a second


@pytest.fixture
def api(kube_cluster: KubeCluster) -> Iterator[Any]:
    with kube_cluster.api_client() as api_client:
        yield api_client


@pytest.fixture
def core(api: Any) -> client.CoreV1Api:
    return client.CoreV1Api(api)


@pytest.fixture
def namespace(kube_cluster: KubeCluster, core: client.CoreV1Api) -> Iterator[str]:
    # create_namespace waits for the default service account: pods created
    # before the controller manager makes it are rejected by admission.
    name = kube_cluster.create_namespace(f"smoke-{uuid.uuid4().hex[:8]}")
    yield name
    try:
        core.delete_namespace(name)
    except ApiException as exc:
        if exc.status != 404:
            raise


def gpu_pod(name: str, gpus: int = 1, **spec: Any) -> dict[str, Any]:
    resources = {GPU_RESOURCE: str(gpus), "cpu": "1", "memory": "1Gi"}
    return {
        "metadata": {"name": name},
        "spec": {
            "containers": [
                {
                    "name": "model",
                    "image": "lmedge/model-server:test",
                    "resources": {"requests": resources, "limits": resources},
                }
            ],
            **spec,
        },
    }


def wait_running(core: client.CoreV1Api, namespace: str, name: str) -> client.V1Pod:
    def running() -> bool:
        return bool(core.read_namespaced_pod(name, namespace).status.phase == "Running")

    wait_until(running, WAIT, f"pod {namespace}/{name} Running")
    pod: client.V1Pod = core.read_namespaced_pod(name, namespace)
    return pod


def gone(read: Any, *args: str) -> bool:
    try:
        read(*args)
    except ApiException as exc:
        if exc.status == 404:
            return True
        raise
    return False


def test_api_server_reports_its_release(api: Any) -> None:
    version = client.VersionApi(api).get_code()

    assert version.git_version.startswith("v1.36."), version.git_version
    assert (version.major, version.minor) == ("1", "36")


def test_testbed_workers_are_ready_with_their_vgpus(core: client.CoreV1Api) -> None:
    nodes = {n.metadata.name: n for n in core.list_node().items}

    assert sorted(nodes) == sorted(w.name for w in TESTBED_WORKERS)
    for worker in TESTBED_WORKERS:
        status = nodes[worker.name].status
        assert status.allocatable.get(GPU_RESOURCE, "0") == str(worker.gpus)
        assert status.allocatable["cpu"] == str(worker.cpu)
        ready = [c.status for c in status.conditions if c.type == "Ready"]
        assert ready == ["True"], worker.name


def test_pod_pinned_to_a_gpu_node_runs(core: client.CoreV1Api, namespace: str) -> None:
    core.create_namespaced_pod(namespace, gpu_pod("pinned", nodeName="worker-2"))

    pod = wait_running(core, namespace, "pinned")

    assert pod.spec.node_name == "worker-2"
    assert pod.status.container_statuses[0].ready is True


def test_scheduler_places_a_gpu_pod_by_node_selector(
    core: client.CoreV1Api, namespace: str
) -> None:
    core.create_namespaced_pod(
        namespace, gpu_pod("selected", nodeSelector={"kubernetes.io/hostname": "worker-6"})
    )

    pod = wait_running(core, namespace, "selected")

    assert pod.spec.node_name == "worker-6"


def test_scheduler_counts_vgpus(core: client.CoreV1Api, namespace: str) -> None:
    # worker-6 has the most vGPUs (4); five fit nowhere.
    core.create_namespaced_pod(namespace, gpu_pod("too-big", gpus=5))

    def unschedulable() -> bool:
        conditions = core.read_namespaced_pod("too-big", namespace).status.conditions or []
        return any(c.type == "PodScheduled" and c.reason == "Unschedulable" for c in conditions)

    wait_until(unschedulable, WAIT, "the scheduler to reject the 5-vGPU pod")
    assert core.read_namespaced_pod("too-big", namespace).spec.node_name is None


def test_deleting_a_namespace_removes_its_pods(
    kube_cluster: KubeCluster, core: client.CoreV1Api
) -> None:
    name = kube_cluster.create_namespace(f"smoke-ns-{uuid.uuid4().hex[:8]}")
    core.create_namespaced_pod(name, gpu_pod("doomed", nodeName="worker-3"))
    wait_running(core, name, "doomed")

    core.delete_namespace(name)

    wait_until(lambda: gone(core.read_namespace, name), WAIT, f"namespace {name} to be deleted")
    assert core.list_pod_for_all_namespaces(field_selector=f"metadata.namespace={name}").items == []


def test_garbage_collector_deletes_children_of_a_deleted_owner(
    core: client.CoreV1Api, namespace: str
) -> None:
    owner = core.create_namespaced_config_map(namespace, {"metadata": {"name": "owner"}})
    ref = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "name": "owner",
        "uid": owner.metadata.uid,
    }
    child = gpu_pod("child", nodeName="worker-4")
    child["metadata"]["ownerReferences"] = [ref]
    core.create_namespaced_pod(namespace, child)
    wait_running(core, namespace, "child")

    core.delete_namespaced_config_map("owner", namespace, propagation_policy="Background")

    wait_until(
        lambda: gone(core.read_namespaced_pod, "child", namespace),
        WAIT,
        "the garbage collector to delete the owned pod",
    )


def test_helm_installs_and_uninstalls_a_chart(
    kube_cluster: KubeCluster, core: client.CoreV1Api, namespace: str, tmp_path: Path
) -> None:
    helm = tools_dir() / "bin" / "helm"
    if not os.access(helm, os.X_OK):
        reason = f"helm not built at {helm} (run `make tools`)"
        if os.environ.get("LMEDGE_REQUIRE_TOOLS", "") not in ("", "0", "false"):
            pytest.fail(reason)
        pytest.skip(reason)
    chart = tmp_path / "probe"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: probe\nversion: 0.1.0\n")
    (chart / "templates" / "cm.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}-probe\n"
        "data:\n  kube: {{ .Capabilities.KubeVersion.Version | quote }}\n"
    )
    # Helm's cache/config/data dirs in the test's tmp dir, not the user's home.
    env = dict(os.environ)
    env.update({f"HELM_{d}_HOME": str(tmp_path / d) for d in ("CACHE", "CONFIG", "DATA")})

    def helm_run(*args: str) -> None:
        subprocess.run(
            [str(helm), *args, "--kubeconfig", str(kube_cluster.kubeconfig), "-n", namespace],
            env=env,
            check=True,
            capture_output=True,
            timeout=120,
        )

    helm_run("install", "smoke", str(chart), "--wait", "--timeout", "60s")
    # .Capabilities comes from the live API server on install, not Helm's default.
    # (Helm v3.22 alone would say v1.37.0.)
    data = core.read_namespaced_config_map("smoke-probe", namespace).data
    assert data["kube"].startswith("v1.36."), data

    helm_run("uninstall", "smoke", "--wait")
    assert gone(core.read_namespaced_config_map, "smoke-probe", namespace)
