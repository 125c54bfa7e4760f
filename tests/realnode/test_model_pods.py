"""The node agent's model pod manifest (lmedge/backends/kubernetes/pods.py) on a
real kubelet, in the real model-server image built by `make images`.

* The pod runs the image's entrypoint with the manifest's args only, becomes
  Ready, and its CPU limit is enforced by its cgroup as decided (requests =
  limits), memory too.
* The progress hostPath: created by whoever runs on the node as uid 10001 (the
  node agent does), the pod is Ready; created root-owned 0755 by the kubelet
  (DirectoryOrCreate), the pod stays unready and says why.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from kubernetes import client

from lmedge.api import LMPlacement, LMServiceSpec, ServiceInfo
from lmedge.backends.kubernetes.pods import MODEL_UID, model_pod, progress_dir
from tests.fixtures.cluster import wait_until
from tests.realnode.tier import WORKERS, RealNodeTier

# Setup includes starting the tier (minutes on a loaded machine) and `helm install --wait`.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]


def _service(tier: RealNodeTier, name: str) -> ServiceInfo:
    spec = LMServiceSpec.model_validate(
        {
            "model": "tiny-gpt2",
            "modality": "text-to-text",
            "image": tier.images["model-server"],
            "minMemoryGib": 0.25,
            "deploymentMemoryGib": 0.5,
            "minVramGib": 0.5,
            "runsOn": "cpu-or-gpu",
            "defaultCpuCores": 1,
            "maxVgpus": 1,
            "serves": ["text-generation"],
            "profile": {"gpuSecondsPerPrompt": 0.1, "cpuSecondsPerPrompt": 0.2},
        }
    )
    return ServiceInfo(name=name, spec=spec)


@pytest.fixture
def core(realnode_tier: RealNodeTier) -> Iterator[client.CoreV1Api]:
    with realnode_tier.cluster.api_client() as api:
        yield client.CoreV1Api(api)


def _create(core: client.CoreV1Api, manifest: dict[str, Any]) -> str:
    core.create_namespaced_pod("default", manifest)
    return str(manifest["metadata"]["name"])


def _delete(core: client.CoreV1Api, name: str) -> None:
    core.delete_namespaced_pod(name, "default", grace_period_seconds=0)

    def gone() -> bool:
        return not [p for p in core.list_namespaced_pod("default").items if p.metadata.name == name]

    wait_until(gone, 60, f"pod {name} deleted", 0.5)


def _ready(core: client.CoreV1Api, name: str) -> bool:
    pod = core.read_namespaced_pod(name, "default")
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


def _cgroup_file(tier: RealNodeTier, pod_uid: str, controller: str, name: str) -> Path:
    """The pod-level cgroup's `name` (the kubelet sets the pod's limits there)."""
    worker = WORKERS[0]
    root = Path("/sys/fs/cgroup") / controller / worker.cgroup
    hits = [p for p in root.rglob(f"pod{pod_uid}") if p.is_dir()]
    assert len(hits) == 1, f"no single {controller} cgroup of pod {pod_uid} under {root}: {hits}"
    return hits[0] / name


def test_model_pod_runs_the_image_entrypoint_with_decided_resources(
    realnode_tier: RealNodeTier, core: client.CoreV1Api
) -> None:
    worker = WORKERS[0]
    lm = f"lm-{uuid.uuid4().hex[:5]}"
    service = _service(realnode_tier, lm)
    manifest = model_pod(service, LMPlacement(lm=lm, mode="cpu", cpu_cores=0.5, vgpus=0),
                         worker.name, "default")  # fmt: skip
    # What the node agent does before creating the pod (it runs as uid 10001).
    host_dir = realnode_tier.host_path(worker, progress_dir(lm))
    host_dir.mkdir(parents=True, exist_ok=True)
    os.chown(host_dir, MODEL_UID, MODEL_UID)
    name = _create(core, manifest)
    try:
        wait_until(lambda: _ready(core, name), 180, f"model pod {name} Ready", 1.0)
        pod = core.read_namespaced_pod(name, "default")
        res = pod.spec.containers[0].resources
        assert res.requests == res.limits == {"cpu": "500m", "memory": "512Mi"}
        # The limits are the kernel's: a CFS quota of half a period, 512 MiB.
        quota = _cgroup_file(realnode_tier, pod.metadata.uid, "cpu", "cpu.cfs_quota_us")
        period = quota.with_name("cpu.cfs_period_us")
        assert int(quota.read_text()) * 2 == int(period.read_text())
        mem = _cgroup_file(realnode_tier, pod.metadata.uid, "memory", "memory.limit_in_bytes")
        assert int(mem.read_text()) == 512 * 2**20
        # The model server answers for its LM on the pod's address.
        url = f"http://{pod.status.pod_ip}:8000"
        assert httpx.get(f"{url}/readyz", timeout=10).status_code == 200
        # A set cut short by its budget keeps its progress file (a complete one
        # is removed): it is on the node's hostPath, written by uid 10001.
        done = httpx.post(
            f"{url}/infer",
            json={"id": "s1", "lm": lm, "budget_s": 1.5,
                  "prompts": [{"text": f"hello edge {i}"} for i in range(5)]},
            timeout=30,
        )  # fmt: skip
        assert done.status_code == 200, done.text
        assert done.json()["complete"] is False, done.json()
        progress = host_dir / "s1.jsonl"
        assert progress.stat().st_uid == MODEL_UID
        assert len(progress.read_text().splitlines()) >= 2  # header + a finished prompt
    finally:
        _delete(core, name)


def test_root_owned_progress_dir_keeps_the_pod_unready_with_the_reason(
    realnode_tier: RealNodeTier, core: client.CoreV1Api
) -> None:
    # No node agent here: the kubelet creates the hostPath (DirectoryOrCreate)
    # root-owned 0755, which uid 10001 cannot write.
    worker = WORKERS[0]
    lm = f"lm-{uuid.uuid4().hex[:5]}"
    manifest = model_pod(_service(realnode_tier, lm),
                         LMPlacement(lm=lm, mode="cpu", cpu_cores=0.5, vgpus=0),
                         worker.name, "default")  # fmt: skip
    name = _create(core, manifest)
    try:

        def running() -> bool:
            pod = core.read_namespaced_pod(name, "default")
            return bool(pod.status.pod_ip) and pod.status.phase == "Running"

        wait_until(running, 180, f"model pod {name} Running", 1.0)
        host_dir = realnode_tier.host_path(worker, progress_dir(lm))
        assert host_dir.stat().st_uid == 0 and (host_dir.stat().st_mode & 0o777) == 0o755
        pod = core.read_namespaced_pod(name, "default")

        def answers() -> bool:
            try:
                httpx.get(f"http://{pod.status.pod_ip}:8000/healthz", timeout=5)
            except httpx.HTTPError:
                return False
            return True

        wait_until(answers, 120, "model server listening", 1.0)
        ready = httpx.get(f"http://{pod.status.pod_ip}:8000/readyz", timeout=10)
        assert ready.status_code == 503
        assert "progress" in ready.text and "writ" in ready.text, ready.text
        assert not _ready(core, name)
    finally:
        _delete(core, name)
