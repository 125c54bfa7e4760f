"""The node agent against a real API server (KWOK plays the kubelets).

The agent's deployer here is a fixed placement, so each test states exactly
what the node should run; everything below it — the snapshot from pods, the
reconcile plan, the pending rule, pod creation and deletion, owner references
and garbage collection — is the production path.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from lmedge.api import Decision, LMPlacement, LoopConstants, NodeObservation, Placement
from lmedge.backends.kubernetes.backend import KubernetesBackend, KubernetesSettings
from lmedge.backends.kubernetes.client import KubeClient
from lmedge.backends.kubernetes.pods import GPU_RESOURCE, LABEL_LM, model_pod
from lmedge.errors import StoreError
from lmedge.nodeagent.agent import NodeAgent
from lmedge.store import open_store
from tests.fixtures.cluster import HOLD_READY_ANNOTATION, REPO, KubeCluster, wait_until

#: Upper bound of a wait. Kubernetes' garbage collector starts following a CRD
#: (the LMService owners) only at its next discovery sync, ~30 s after the CRD
#: appears, and slower on a loaded machine.
WAIT = 120.0
GROUP, VERSION = "lmedge.io", "v1alpha1"


class FixedDeployer:
    """A deployer plugin that always answers with `placement` (set by the test)."""

    name = "fixed"

    def __init__(self, placement: Placement) -> None:
        self.placement = placement

    def place(self, obs: NodeObservation) -> Decision[Placement]:
        return Decision[Placement](
            agent="deployer", policy=self.name, source="rule", value=self.placement
        )


def on(node: str, *lms: LMPlacement) -> Placement:
    return Placement(node=node, lms=list(lms))


def gpu(lm: str, vgpus: int, cores: float) -> LMPlacement:
    return LMPlacement(lm=lm, mode="gpu", cpu_cores=cores, vgpus=vgpus)


def cpu(lm: str, cores: float) -> LMPlacement:
    return LMPlacement(lm=lm, mode="cpu", cpu_cores=cores, vgpus=0)


@pytest.fixture
def namespace(lmedge_cluster: KubeCluster) -> Iterator[str]:
    """A fresh namespace holding the testbed's four LMServices."""
    name = lmedge_cluster.create_namespace(f"agent-{uuid.uuid4().hex[:6]}")
    with lmedge_cluster.api_client() as api:
        custom = client.CustomObjectsApi(api)
        for doc in yaml.safe_load_all((REPO / "examples/testbed/services.yaml").read_text()):
            if doc:
                custom.create_namespaced_custom_object(GROUP, VERSION, name, "lmservices", doc)
        yield name
        client.CoreV1Api(api).delete_namespace(name)


@pytest.fixture
def kube(lmedge_cluster: KubeCluster) -> Iterator[KubeClient]:
    k = KubeClient.connect(lmedge_cluster.kubeconfig)
    yield k
    k.close()


@pytest.fixture
def core(lmedge_cluster: KubeCluster) -> Iterator[client.CoreV1Api]:
    with lmedge_cluster.api_client() as api:
        yield client.CoreV1Api(api)


@pytest.fixture
def lmedge_system(lmedge_cluster: KubeCluster) -> None:
    """The controller's lease namespace, made once (a 409 means an earlier test made it)."""
    try:
        lmedge_cluster.create_namespace("lmedge-system")
    except ApiException as exc:
        if exc.status != 409:
            raise


def agent_for(kube: KubeClient, namespace: str, node: str, placement: Placement) -> NodeAgent:
    backend = KubernetesBackend(
        kube, KubernetesSettings(namespace=namespace, loop=LoopConstants(slot_s=1.0))
    )
    return NodeAgent(node, backend, FixedDeployer(placement))


def pods(core: client.CoreV1Api, namespace: str, node: str | None = None) -> list[Any]:
    field = f"spec.nodeName={node}" if node else None
    out = core.list_namespaced_pod(namespace, label_selector=LABEL_LM, field_selector=field)
    return [p for p in out.items if p.metadata.deletion_timestamp is None]


def all_ready(core: client.CoreV1Api, namespace: str, node: str) -> bool:
    return all(
        any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])
        for p in pods(core, namespace, node)
    )


def test_agent_creates_pods_with_the_exact_resources(
    kube: KubeClient, core: client.CoreV1Api, namespace: str
) -> None:
    agent = agent_for(
        kube, namespace, "worker-6", on("worker-6", gpu("lm4", 2, 2.5), cpu("lm1", 4))
    )

    report = agent.step(0)

    assert report.decision.outcome == "accepted", report.decision.violations
    assert (report.actuation.started, report.actuation.errors) == (["lm1", "lm4"], [])
    created = {p.metadata.labels[LABEL_LM]: p for p in pods(core, namespace)}
    assert sorted(created) == ["lm1", "lm4"]
    lm4 = created["lm4"].spec.containers[0].resources
    assert lm4.requests == lm4.limits == {"cpu": "2500m", "memory": "3584Mi", GPU_RESOURCE: "2"}
    lm1 = created["lm1"].spec.containers[0].resources
    assert lm1.requests == lm1.limits == {"cpu": "4", "memory": "3Gi"}
    owners = client.CustomObjectsApi(kube.api).list_namespaced_custom_object(
        GROUP, VERSION, namespace, "lmservices"
    )["items"]
    uid = {o["metadata"]["name"]: o["metadata"]["uid"] for o in owners}
    for lm, pod in created.items():
        assert pod.spec.node_name == "worker-6"
        (ref,) = pod.metadata.owner_references
        assert (ref.kind, ref.name, ref.uid, ref.controller) == ("LMService", lm, uid[lm], True)
        assert pod.spec.containers[0].readiness_probe.http_get.path == "/readyz"
        assert pod.metadata.labels["app.kubernetes.io/managed-by"] == "lmedge-node-agent"


def test_reapplying_a_placement_changes_nothing(
    kube: KubeClient, core: client.CoreV1Api, namespace: str
) -> None:
    agent = agent_for(kube, namespace, "worker-5", on("worker-5", gpu("lm2", 1, 2)))
    agent.step(0)
    wait_until(lambda: all_ready(core, namespace, "worker-5"), WAIT, "lm2 Ready")
    before = {p.metadata.name: p.metadata.uid for p in pods(core, namespace, "worker-5")}

    again = agent.step(1)

    assert again.actuation.model_dump(exclude={"node"}) == {
        "started": [], "stopped": [], "resized": [], "voided": [], "errors": [],
    }  # fmt: skip
    after = {p.metadata.name: p.metadata.uid for p in pods(core, namespace, "worker-5")}
    assert after == before


def test_resize_and_stop(kube: KubeClient, core: client.CoreV1Api, namespace: str) -> None:
    deployer = FixedDeployer(on("worker-2", gpu("lm3", 1, 2), cpu("lm1", 2)))
    backend = KubernetesBackend(
        kube, KubernetesSettings(namespace=namespace, loop=LoopConstants(slot_s=1.0))
    )
    agent = NodeAgent("worker-2", backend, deployer)
    agent.step(0)
    wait_until(lambda: all_ready(core, namespace, "worker-2"), WAIT, "pods Ready")

    deployer.placement = on("worker-2", gpu("lm3", 2, 2))
    report = agent.step(1)

    assert (report.actuation.resized, report.actuation.stopped) == (["lm3"], ["lm1"])
    left = pods(core, namespace, "worker-2")
    assert [p.metadata.labels[LABEL_LM] for p in left] == ["lm3"]
    assert left[0].spec.containers[0].resources.limits[GPU_RESOURCE] == "2"


def test_pending_rule_voids_creations_while_a_pod_is_cold_starting(
    kube: KubeClient, core: client.CoreV1Api, namespace: str
) -> None:
    agent = agent_for(kube, namespace, "worker-3", on("worker-3", gpu("lm4", 1, 2), cpu("lm1", 4)))
    # A cold-starting lm4 pod the agent itself would have created: Pending, not Ready.
    held = model_pod(agent.ctx.service("lm4"), gpu("lm4", 1, 2), "worker-3", namespace)
    held["metadata"]["annotations"][HOLD_READY_ANNOTATION] = "true"
    core.create_namespaced_pod(namespace, held)

    blocked = agent.step(0)

    assert blocked.actuation.voided == ["lm1"]
    assert blocked.actuation.started == []
    assert [p.metadata.labels[LABEL_LM] for p in pods(core, namespace, "worker-3")] == ["lm4"]

    core.patch_namespaced_pod(
        held["metadata"]["name"],
        namespace,
        {"metadata": {"annotations": {HOLD_READY_ANNOTATION: None}}},
    )
    wait_until(lambda: all_ready(core, namespace, "worker-3"), WAIT, "the held pod Ready")
    freed = agent.step(1)

    assert (freed.actuation.started, freed.actuation.voided) == (["lm1"], [])


def test_deleting_an_lmservice_garbage_collects_its_pods(
    kube: KubeClient, core: client.CoreV1Api, namespace: str
) -> None:
    agent = agent_for(kube, namespace, "worker-4", on("worker-4", gpu("lm2", 1, 2), cpu("lm1", 4)))
    agent.step(0)
    assert len(pods(core, namespace, "worker-4")) == 2

    client.CustomObjectsApi(kube.api).delete_namespaced_custom_object(
        GROUP, VERSION, namespace, "lmservices", "lm2"
    )

    def only_lm1() -> bool:
        return [p.metadata.labels[LABEL_LM] for p in pods(core, namespace, "worker-4")] == ["lm1"]

    wait_until(only_lm1, WAIT, "the garbage collector to delete lm2's pod")


class CrashingClient(KubeClient):
    """The real client, but the process "dies" after `creates` pod creations."""

    def __init__(self, base: KubeClient, creates: int) -> None:
        super().__init__(base.api, base.retry)
        self.left = creates

    def create_pod(self, manifest: Any) -> bool:
        if self.left == 0:
            raise KeyboardInterrupt("killed mid-slot")
        self.left -= 1
        return super().create_pod(manifest)


def test_agent_killed_mid_slot_and_restarted_leaves_no_orphan_or_duplicate(
    kube: KubeClient, core: client.CoreV1Api, namespace: str
) -> None:
    first = on("worker-6", gpu("lm3", 1, 2), gpu("lm4", 1, 2), cpu("lm1", 2))
    dying = agent_for(CrashingClient(kube, creates=1), namespace, "worker-6", first)
    with pytest.raises(KeyboardInterrupt):
        dying.step(0)
    assert len(pods(core, namespace, "worker-6")) == 1
    # Restarted with a different decision: lm4 resized, lm3 off, lm1 as before.
    second = on("worker-6", gpu("lm4", 2, 2), cpu("lm1", 2))
    restarted = agent_for(kube, namespace, "worker-6", second)

    for slot in range(1, 4):
        restarted.step(slot)
        wait_until(lambda: all_ready(core, namespace, "worker-6"), WAIT, "pods Ready")

    left = pods(core, namespace, "worker-6")
    by_lm = sorted((p.metadata.labels[LABEL_LM], p.metadata.name) for p in left)
    assert [lm for lm, _ in by_lm] == ["lm1", "lm4"], by_lm
    limits = {p.metadata.labels[LABEL_LM]: p.spec.containers[0].resources.limits for p in left}
    assert limits["lm4"][GPU_RESOURCE] == "2"
    assert GPU_RESOURCE not in limits["lm1"]


def test_agent_refuses_a_node_that_is_not_a_worker(kube: KubeClient, namespace: str) -> None:
    backend = KubernetesBackend(kube, KubernetesSettings(namespace=namespace))
    with pytest.raises(Exception, match="control is not a worker EdgeNode"):
        NodeAgent("control", backend, FixedDeployer(on("control")))


def test_delete_of_a_missing_pod_is_not_an_error(kube: KubeClient, namespace: str) -> None:
    assert kube.delete_pod(namespace, "never-existed") is False
    with pytest.raises(ApiException):
        kube.core.read_namespaced_pod("never-existed", namespace)


# -- the real processes ---------------------------------------------------------


def lmedge(*args: str, log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:  # the child keeps its own descriptor
        return subprocess.Popen(
            [str(Path(sys.executable).parent / "lmedge"), *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )


@pytest.mark.slow
@pytest.mark.usefixtures("lmedge_system")
def test_controller_and_node_agent_processes_survive_an_agent_kill(
    lmedge_cluster: KubeCluster,
    core: client.CoreV1Api,
    namespace: str,
    ferretdb_uri: str,
    tmp_path: Path,
) -> None:
    env = {**os.environ, "KUBECONFIG": str(lmedge_cluster.kubeconfig)}
    run = f"proc-{uuid.uuid4().hex[:6]}"
    common = ["--namespace", namespace, "--store", ferretdb_uri]
    log = tmp_path / "processes.log"
    controller = lmedge(
        "controller", *common, "-p", "rf", "--slot-s", "1", "--run", run,
        "--lease-name", f"ctl-{run}", "--epoch-slots", "5",
        log=log, env=env,
    )  # fmt: skip
    # No loop or policy flags: the agents read the 1-s slot from the stored run.
    agent_args = ["--node", "worker-1", *common, "--run", run]
    agents: list[subprocess.Popen[bytes]] = []
    store = open_store(ferretdb_uri)

    def started() -> bool:
        try:
            return any(r.id == run for r in store.runs(limit=5))
        except StoreError:
            return False

    def agent_decisions() -> list[Any]:
        return store.decisions(agent="deployer", run=run, node="worker-1", limit=100)

    try:
        wait_until(started, 60, f"the controller to register run {run}")
        agents.append(lmedge("node-agent", *agent_args, log=log, env=env))
        wait_until(lambda: bool(pods(core, namespace, "worker-1")), 60, "the agent's first pod")
        agents[0].kill()  # SIGKILL: no cleanup of any kind
        agents[0].wait()
        agents.append(lmedge("node-agent", *agent_args, log=log, env=env))
        seen = len(agent_decisions())
        wait_until(lambda: len(agent_decisions()) >= seen + 3, 60, "three slots of the new agent")
        wait_until(lambda: all_ready(core, namespace, "worker-1"), WAIT, "pods Ready")

        latest = agent_decisions()[0].value
        running = sorted(p.metadata.labels[LABEL_LM] for p in pods(core, namespace, "worker-1"))
        assert running == sorted(latest.active()), log.read_text()[-3000:]
        assert len(set(running)) == len(running)  # no duplicate
        routed = store.decisions(agent="scheduler", run=run, limit=1)
        assert routed and routed[0].value.routes
    finally:
        for proc in [*agents, controller]:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        codes = [proc.wait(timeout=60) for proc in [*agents[1:], controller]]
        store.close()
    assert codes == [0, 0], log.read_text()[-3000:]


def test_run_stops_and_names_the_run_that_supersedes_this_one(
    kube: KubeClient, namespace: str
) -> None:
    agent = agent_for(kube, namespace, "worker-6", on("worker-6"))
    asked: list[int] = []

    def superseded() -> str | None:
        asked.append(1)
        return "k8s-newer" if len(asked) == 2 else None

    reports: list[Any] = []
    newer = agent.run(slots=10, on_slot=reports.append, superseded=superseded)
    assert newer == "k8s-newer" and len(reports) == 2  # asked after each slot, stopped at once
    assert agent.run(slots=1) is None  # stopped by `slots`: no newer run


@pytest.mark.slow
@pytest.mark.usefixtures("lmedge_system")
def test_a_node_agent_follows_a_restarted_controller_to_its_new_run(
    lmedge_cluster: KubeCluster,
    namespace: str,
    ferretdb_uri: str,
    tmp_path: Path,
) -> None:
    """Without --run the agent serves the newest run; a controller restarted
    without --run starts a new one, and the agent moves to it (before, it kept
    reading the old run's policies and configuration until it was restarted)."""
    env = {**os.environ, "KUBECONFIG": str(lmedge_cluster.kubeconfig)}
    tag = uuid.uuid4().hex[:6]
    first, second = f"follow-a-{tag}", f"follow-b-{tag}"
    common = ["--namespace", namespace, "--store", ferretdb_uri]
    log = tmp_path / "processes.log"
    store = open_store(ferretdb_uri)

    def controller(run: str) -> subprocess.Popen[bytes]:
        return lmedge(
            "controller", *common, "-p", "rf", "--slot-s", "1", "--run", run,
            "--lease-name", f"ctl-{tag}", "--epoch-slots", "5", log=log, env=env,
        )  # fmt: skip

    def registered(run: str) -> bool:
        try:
            return any(r.id == run for r in store.runs(limit=5))
        except StoreError:
            return False

    def decided(run: str) -> int:
        try:
            return len(store.decisions(agent="deployer", run=run, node="worker-1", limit=20))
        except StoreError:
            return 0

    procs: list[subprocess.Popen[bytes]] = []
    try:
        procs.append(controller(first))
        wait_until(lambda: registered(first), 60, f"the controller to register run {first}")
        agent = lmedge("node-agent", "--node", "worker-1", *common, log=log, env=env)
        procs.append(agent)
        wait_until(lambda: decided(first) >= 2, 60, f"the agent deciding in run {first}")
        procs[0].send_signal(signal.SIGTERM)
        assert procs[0].wait(timeout=60) == 0, log.read_text()[-3000:]
        procs.append(controller(second))
        wait_until(lambda: decided(second) >= 2, 90, f"the agent following to run {second}")
        assert agent.poll() is None, "the same agent process, not a restart"
        assert f"the controller started run {second}; following it" in log.read_text()
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        codes = [proc.wait(timeout=60) for proc in procs[1:]]
        store.close()
    assert codes == [0, 0], log.read_text()[-3000:]


def test_agent_stores_its_node_telemetry_each_slot(
    kube: KubeClient, namespace: str, tmp_path: Path
) -> None:
    from lmedge.nodeagent.telemetry import ExporterTargets, TelemetryCollector
    from tests.integration.test_telemetry import SAMPLES, Exporter

    node_exporter = Exporter((SAMPLES / "node-exporter.txt").read_text())
    dcgm = Exporter((SAMPLES / "dcgm-exporter.txt").read_text())
    store = open_store(str(tmp_path / "store"))
    try:
        backend = KubernetesBackend(
            kube, KubernetesSettings(namespace=namespace, loop=LoopConstants(slot_s=1.0))
        )
        target = ExporterTargets("worker-6", f"{node_exporter.url}/metrics", f"{dcgm.url}/metrics")
        collector = TelemetryCollector([target], run="telemetry-run")
        agent = NodeAgent(
            "worker-6", backend, FixedDeployer(on("worker-6")), store=store, telemetry=collector
        )
        agent.step(0)
        store.flush()
        (snap,) = store.telemetry(node="worker-6")
        assert snap.source == "exporter" and snap.run == "telemetry-run"
        assert snap.gpu_util and 0 <= snap.memory_util <= 1
    finally:
        store.close()
        node_exporter.close()
        dcgm.close()


@pytest.mark.ferretdb
def test_agent_survives_an_unreadable_policy_and_a_reply_it_cannot_store(
    kube: KubeClient, namespace: str, ferretdb_uri: str, tmp_path: Path
) -> None:
    """A stored macro policy this agent cannot read (another version wrote it)
    escaped `run()` and stopped the agent; a deployer's decision with a token
    count beyond BSON's 64 bits failed its write. Both now leave the agent
    running, and every slot's decision is stored once."""
    import pymongo

    from lmedge.store import StoreOptions

    class HugeTokens(FixedDeployer):
        """Reports usage as an LLM agent does, with a bogus token count."""

        def place(self, obs: NodeObservation) -> Decision[Placement]:
            return Decision[Placement](
                agent="deployer", policy=self.name, source="llm", value=self.placement,
                tokens_in=2**64 + 1, raw="{}",
            )  # fmt: skip

    with pymongo.MongoClient(ferretdb_uri) as raw:
        raw.get_default_database()["macro_policies"].insert_one(
            {"_id": "bogus", "_seq": 2**62, "agent": "planner", "run": "robust-run",
             "value": {"routing": "not a list"}}
        )  # fmt: skip
    store = open_store(ferretdb_uri, options=StoreOptions(spill_dir=tmp_path / "spill"))
    backend = KubernetesBackend(
        kube,
        KubernetesSettings(namespace=namespace, loop=LoopConstants(slot_s=1.0), run="robust-run"),
    )
    agent = NodeAgent("worker-6", backend, HugeTokens(on("worker-6")), store=store)
    reports: list[Any] = []
    try:
        agent.run(slots=2, on_slot=reports.append)
        store.flush()
        stored = store.decisions(agent="deployer", run="robust-run", limit=10)
        stats = store.buffer_stats()
    finally:
        store.close()
    assert len(reports) == 2, "both slots ran"
    assert sorted(d.slot for d in stored) == sorted(r.slot for r in reports)
    assert stats.lost == 0 and all(d.tokens_in < 2**63 for d in stored)
