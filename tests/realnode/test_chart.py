"""`helm install` of charts/lmedge on the real-node tier, end to end.

In order (one release for the module; each test builds on the one before):
install with the locally built images → the controller, both node agents with
their gateways, and the store (FerretDB in the chart's mongodb StatefulSet)
Running and Ready → EdgeNodes and an LMService applied → the node agents start
a real model pod with the decided CPU requests = limits and the service's
memory → an OpenAI SDK request to worker-1's gateway is served by the model
pod on worker-2 → its request record, with the four stage timings, is in the
store → an llama.cpp LMService (llama-server, the small GGUF baked in) gets
its pod on worker-2, and a streamed chat completion sent to worker-1's gateway
is served there in several chunks, its record (TTFT, tokens) in the store →
a model server killed mid prompt set resumes without repeating a
prompt (its progress file on the worker's hostPath, written by uid 10001) →
`helm test` passes → `helm upgrade` keeps the user token, the store password
and the data → `helm uninstall` leaves no pod behind.

The LMService fits only worker-2 (worker-1's EdgeNode has too little memory),
so routing from worker-1 must cross to the other worker.
"""

from __future__ import annotations

import base64
import concurrent.futures
import contextlib
import os
import re
import shlex
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import pymongo
import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from lmedge.backends.kubernetes.pods import MODEL_UID, progress_dir
from tests.fixtures.cluster import REPO, tools_dir, wait_until
from tests.realnode.tier import WORKERS, RealNodeTier

# Setup includes starting the tier (minutes on a loaded machine) and `helm install --wait`.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

CHART = REPO / "charts" / "lmedge"
RELEASE = "lmr"
NS = "lmedge-system"
WORKLOADS = "lm-serving"
LM = "lm1"
STORE_CLASS = "realnode-local"
STORE_DIR = "/var/lib/lmedge-test/mongodb"
#: FerretDB's uid in the chart's mongodb pod (the official image's mongodb user).
STORE_UID = 999
#: Seconds per prompt of the test model-server image (make images: STUB_SECONDS).
PROMPT_S = 1.0


def _services(tier: RealNodeTier) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "lmedge.io/v1alpha1",
            "kind": "LMService",
            "metadata": {"name": LM},
            "spec": {
                "model": "tiny-gpt2",
                "modality": "text-to-text",
                "image": tier.images["model-server"],
                # Fits worker-2 only: worker-1's EdgeNode has 1 GiB.
                "minMemoryGib": 1.25,
                "deploymentMemoryGib": 1.5,
                "minVramGib": 0.5,
                "runsOn": "cpu-or-gpu",
                "defaultCpuCores": 1,
                "maxVgpus": 1,
                "serves": ["text-generation"],
                "profile": {"gpuSecondsPerPrompt": PROMPT_S, "cpuSecondsPerPrompt": PROMPT_S},
            },
        },
        sort_keys=False,
    )


def _edge_nodes() -> list[dict[str, Any]]:
    common = {"role": "worker", "site": "lab", "intraSiteBandwidthMbps": 10000,
              "intraSiteLatencyMs": 0.5}  # fmt: skip
    small = {**common, "cpuCores": 1, "memoryGib": 1}
    gpu = {**common, "cpuCores": 2, "memoryGib": 8,
           "gpus": [{"model": "NVIDIA-A5000", "vramGib": 24}], "vgpusPerGpu": 2}  # fmt: skip
    return [
        {"apiVersion": "lmedge.io/v1alpha1", "kind": "EdgeNode",
         "metadata": {"name": w.name}, "spec": spec}
        for w, spec in zip(WORKERS, (small, gpu), strict=True)
    ]  # fmt: skip


def helm(tier: RealNodeTier, *args: str, check: bool = True, timeout: float = 600) -> str:
    env = {**os.environ, "KUBECONFIG": str(tier.cluster.kubeconfig)}
    for kind in ("CACHE", "CONFIG", "DATA"):
        env[f"HELM_{kind}_HOME"] = str(tier.workdir / "helm" / kind.lower())
    done = subprocess.run([str(tools_dir() / "bin" / "helm"), *args], capture_output=True,
                          text=True, env=env, timeout=timeout)  # fmt: skip
    if check and done.returncode != 0:
        raise AssertionError(f"helm {shlex.join(args)} failed:\n{done.stderr}\n{done.stdout}")
    return done.stdout + done.stderr


def _values(tier: RealNodeTier) -> list[str]:
    repo, _, tag = tier.images["lmedge"].rpartition(":")
    services = tier.workdir / "services.yaml"
    services.write_text(_services(tier))
    return [
        "--set", f"image.repository={repo}", "--set", f"image.tag={tag}",
        # The images were imported into each worker's containerd; nothing to pull.
        "--set", "image.pullPolicy=Never",
        "--set", f"mongodb.image={tier.images['ferretdb']}",
        "--set", f"mongodb.persistence.storageClass={STORE_CLASS}",
        "--set", "mongodb.persistence.size=1Gi",
        "--set", f"workloadNamespace={WORKLOADS}",
        "--set-file", f"lmServices={services}",
        # No node-exporter / dcgm-exporter images here (and no GPUs for dcgm).
        "--set", "exporters.nodeExporter.enabled=false",
        "--set", "exporters.dcgmExporter.enabled=false",
        "--set", "loop.slotSeconds=5",
        "--set", "loop.epochSlots=4",
        "--set", "loop.tauSeconds=120",
        # Random routing over feasible nodes + full activation: lm1 is deployed
        # at once, where it fits (worker-2 only), without waiting for demand.
        "--set", "policy.profile=rf",
        "--set", f"fullnameOverride={RELEASE}",
    ]  # fmt: skip


@pytest.fixture(scope="module")
def api(realnode_tier: RealNodeTier) -> Iterator[client.ApiClient]:
    with realnode_tier.cluster.api_client() as api_client:
        yield api_client


@pytest.fixture(scope="module")
def release(realnode_tier: RealNodeTier, api: client.ApiClient) -> Iterator[dict[str, Any]]:
    """The installed release (uninstalled by the last test; cleaned up here if not)."""
    tier = realnode_tier
    core = client.CoreV1Api(api)
    core.create_namespace({"metadata": {"name": WORKLOADS}})
    # No provisioner: a local volume on worker-1, owned by the store's uid.
    store_dir = tier.host_path(WORKERS[0], STORE_DIR)
    store_dir.mkdir(parents=True, exist_ok=True)
    os.chown(store_dir, STORE_UID, STORE_UID)
    core.create_persistent_volume(
        {
            "metadata": {"name": "realnode-store"},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": STORE_CLASS,
                "hostPath": {"path": STORE_DIR, "type": "Directory"},
                "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "kubernetes.io/hostname", "operator": "In",
                     "values": [WORKERS[0].name]}]}]}},
            },
        }
    )  # fmt: skip
    values = _values(tier)
    started = time.monotonic()
    out = helm(tier, "install", RELEASE, str(CHART), "-n", NS, "--create-namespace",
               *values, "--wait", "--timeout", "600s")  # fmt: skip
    info: dict[str, Any] = {"values": values, "install_s": time.monotonic() - started,
                            "output": out, "uninstalled": False}  # fmt: skip
    custom = client.CustomObjectsApi(api)
    try:
        # The CRDs came with the chart. The operator labels the EdgeNodes'
        # Nodes lmedge.io/role=worker; the node agents (a DaemonSet on that
        # label) follow.
        for doc in _edge_nodes():
            custom.create_cluster_custom_object("lmedge.io", "v1alpha1", "edgenodes", doc)
        custom.create_namespaced_custom_object("lmedge.io", "v1alpha1", WORKLOADS, "lmservices",
                                               yaml.safe_load(_services(tier)))  # fmt: skip
        yield info
    finally:
        # LMServices first, while the operator still runs to release them.
        try:
            custom.delete_namespaced_custom_object("lmedge.io", "v1alpha1", WORKLOADS,
                                                   "lmservices", LM)  # fmt: skip
        except ApiException as exc:
            if exc.status != 404:
                raise
        with contextlib.suppress(TimeoutError):
            wait_until(lambda: not custom.list_namespaced_custom_object(
                "lmedge.io", "v1alpha1", WORKLOADS, "lmservices")["items"], 60,
                "LMServices released by the operator", 1.0)  # fmt: skip
        for w in WORKERS:
            try:
                custom.delete_cluster_custom_object("lmedge.io", "v1alpha1", "edgenodes", w.name)
            except ApiException as exc:
                if exc.status != 404:
                    raise
        if not info["uninstalled"]:
            helm(tier, "uninstall", RELEASE, "-n", NS, "--wait", check=False)
        for ns in (NS, WORKLOADS):
            try:
                core.delete_namespace(ns)
            except ApiException as exc:
                if exc.status != 404:
                    raise

        def gone() -> bool:
            names = {n.metadata.name for n in core.list_namespace().items}
            return not names & {NS, WORKLOADS}

        wait_until(gone, 180, "the test namespaces deleted", 1.0)
        try:
            core.delete_persistent_volume("realnode-store")
        except ApiException as exc:
            if exc.status != 404:
                raise


def _pods(core: client.CoreV1Api, ns: str, selector: str = "") -> list[Any]:
    return list(core.list_namespaced_pod(ns, label_selector=selector).items)


def _ready(pod: Any) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


def _secret(core: client.CoreV1Api, name: str, key: str) -> str:
    return base64.b64decode(core.read_namespaced_secret(name, NS).data[key]).decode()


def _store(core: client.CoreV1Api) -> pymongo.MongoClient[Any]:
    """The release's store, from this machine: its URI with the pod's address."""
    uri = _secret(core, f"{RELEASE}-store", "uri")
    (pod,) = _pods(core, NS, "app.kubernetes.io/component=mongodb")
    parts = urlsplit(uri)
    creds = parts.netloc.rpartition("@")[0]
    return pymongo.MongoClient(
        urlunsplit(parts._replace(netloc=f"{creds}@{pod.status.pod_ip}:27017")),
        serverSelectionTimeoutMS=10000,
    )


def _model_pod(core: client.CoreV1Api) -> Any:
    pods = [p for p in _pods(core, WORKLOADS, f"lmedge.io/lm={LM}")
            if p.metadata.deletion_timestamp is None]  # fmt: skip
    return pods[0] if len(pods) == 1 else None


def test_install_brings_the_control_plane_up(
    realnode_tier: RealNodeTier, api: client.ApiClient, release: dict[str, Any]
) -> None:
    core = client.CoreV1Api(api)

    def up() -> bool:
        agents = _pods(core, NS, "app.kubernetes.io/component=node-agent")
        return len(agents) == len(WORKERS) and all(_ready(p) for p in _pods(core, NS))

    try:
        wait_until(up, 300, "controller, node agents + gateways and store Ready", 2.0)
    except TimeoutError as exc:
        raise AssertionError(f"{exc}:\n{_describe(core, NS)}") from None
    by_component: dict[str, list[Any]] = {}
    for pod in _pods(core, NS):
        by_component.setdefault(pod.metadata.labels["app.kubernetes.io/component"], []).append(pod)
    assert sorted(by_component) == ["controller", "mongodb", "node-agent"]
    agents = by_component["node-agent"]
    assert sorted(p.spec.node_name for p in agents) == [w.name for w in WORKERS]
    for pod in agents:
        assert [c.name for c in pod.spec.containers] == ["node-agent", "gateway"]
        assert all(s.ready for s in pod.status.container_statuses)
    # Nodes carry the fake time-sliced GPUs the model pods may request.
    for w in WORKERS:
        assert core.read_node(w.name).status.allocatable["nvidia.com/gpu"] == str(w.gpus)


def _ready_pod(core: client.CoreV1Api, find: Callable[[client.CoreV1Api], Any], what: str) -> Any:
    """The pod `find` returns once it is Ready (5 minutes at most; the namespaces on failure)."""

    def started() -> bool:
        pod = find(core)
        return pod is not None and _ready(pod)

    try:
        wait_until(started, 300, what, 2.0)
    except TimeoutError as exc:
        raise AssertionError(
            f"{exc}:\n{_describe(core, WORKLOADS)}\n{_describe(core, NS)}"
        ) from None
    return find(core)


def test_node_agent_starts_the_model_pod_with_decided_resources(api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    pod = _ready_pod(core, _model_pod, f"a Ready model pod of {LM}")
    assert pod.spec.node_name == WORKERS[1].name
    (container,) = pod.spec.containers
    res = container.resources
    assert res.requests == res.limits
    assert res.requests["memory"] == "1536Mi"  # deploymentMemoryGib 1.5
    # The CPU (or vGPUs) are the deployer's decision for this node, as stored.
    store = _store(core)
    try:
        db = store.get_default_database()
        decisions = list(db["deployments"].find({"agent": "deployer", "node": WORKERS[1].name}))
    finally:
        store.close()
    assert decisions, "no deployer decision for worker-2 in the store"
    placed = [lm for d in decisions for lm in d["value"]["lms"] if lm["lm"] == LM
              and lm["mode"] == pod.metadata.labels["lmedge.io/mode"]]  # fmt: skip
    assert placed, decisions[-1]
    cores = {float(p["cpu_cores"]) for p in placed}
    cpu = res.requests["cpu"]
    assert (int(cpu[:-1]) / 1000 if cpu.endswith("m") else float(cpu)) in cores
    # Its image through its own entrypoint: args only, no command.
    assert container.command is None and "--lm" in container.args


def _user_token(core: client.CoreV1Api) -> str:
    return _secret(core, f"{RELEASE}-gateway-token", "token").strip()


def test_openai_request_to_one_gateway_is_served_on_the_other_worker(
    api: client.ApiClient,
) -> None:
    import openai

    core = client.CoreV1Api(api)
    origin = WORKERS[0]
    sdk = openai.OpenAI(base_url=f"http://{origin.ip}:8080/v1", api_key=_user_token(core),
                        timeout=120, max_retries=0)  # fmt: skip
    marker = uuid.uuid4().hex[:8]
    with _explained(core):
        reply = sdk.chat.completions.create(
            model=LM, messages=[{"role": "user", "content": f"hello from the edge {marker}"}]
        )
    assert reply.choices[0].message.content
    store = _store(core)
    try:
        db = store.get_default_database()

        def recorded() -> list[dict[str, Any]]:
            return [r for r in db["requests"].find({"lm": LM, "origin": origin.name})]

        wait_until(lambda: bool(recorded()), 60, "the request's record in the store", 1.0)
        record = recorded()[-1]
    finally:
        store.close()
    assert record["outcome"] == "success", record
    assert record["destination"] == WORKERS[1].name
    for stage in ("uplink_s", "queue_s", "inference_s", "downlink_s"):
        assert stage in record and record[stage] >= 0, (stage, record)
    assert record["inference_s"] >= PROMPT_S * 0.9


#: The llama.cpp LMService: llama-server with the Gemma 3 270M GGUF baked in
#: (the llama-cpp image `make images` built).
LLAMA_LM = "gemma3"
#: What a streamed reply may hold at most (enough for several chunks, short on a loaded CPU).
LLAMA_MAX_TOKENS = 24


def _llama_service(tier: RealNodeTier) -> dict[str, Any]:
    """A llama.cpp LMService that fits worker-2 only, like lm1 (worker-1's EdgeNode has 1 GiB).

    Gemma 3 270M: 18 layers x 1 KV head x 256 dims, f16 K and V: 18,432 bytes a
    token. The throughput is about one thread's on a shared 2-core machine
    (llama-server's own timings: decode ~20 tokens/s, prefill ~90 tokens/s on
    a cold first prompt, more once warm); `lmedge` plans with it, the server
    does not read it. Half a core fits beside lm1 and the node agent on the
    2-CPU kubelet.
    """
    speed = {
        "prefillTokensPerS": 300,
        "decode": [{"running": 1, "tokensPerS": 20}, {"running": 2, "tokensPerS": 30}],
    }
    return {
        "apiVersion": "lmedge.io/v1alpha1",
        "kind": "LMService",
        "metadata": {"name": LLAMA_LM},
        "spec": {
            "model": "google/gemma-3-270m-it",
            "modality": "text-to-text",
            "image": tier.images["llama-cpp"],
            "minMemoryGib": 1.25,
            "deploymentMemoryGib": 1.5,
            "minVramGib": 1,
            "runsOn": "cpu-or-gpu",
            "defaultCpuCores": 0.5,
            "maxVgpus": 1,
            # engine.model.path: its default /models/model.gguf, baked into the image.
            "engine": {"kind": "llama.cpp", "tokens": {
                "weightsGib": 0.5, "kvBytesPerToken": 18432, "kvCacheGib": 0.125,
                "contextTokens": 2048, "maxRunningSequences": 2,
                "gpus": [{"gpuModel": "*", **speed}], "cpu": speed}},
        },
    }  # fmt: skip


def _llama_pod(core: client.CoreV1Api) -> Any:
    pods = [p for p in _pods(core, WORKLOADS, f"lmedge.io/lm={LLAMA_LM}")
            if p.metadata.deletion_timestamp is None]  # fmt: skip
    return pods[0] if len(pods) == 1 else None


def test_llama_cpp_stream_to_one_gateway_is_served_on_the_other_worker(
    realnode_tier: RealNodeTier, api: client.ApiClient, release: dict[str, Any]
) -> None:
    """An `engine.kind: llama.cpp` LMService with the baked GGUF: its llama-server pod
    starts on worker-2's kubelet (the args the admission policy admits), a streamed
    chat completion sent to worker-1's gateway is forwarded there and comes back in
    several chunks, and its record (TTFT, token counts) is in the store. The
    LMService is deleted at the end, so the later tests see lm1 alone."""
    if "llama-cpp" not in realnode_tier.images:
        reason = "no llama-cpp image (make images needs .tools/bin/llama-server: make tools)"
        if os.environ.get("LMEDGE_REQUIRE_TOOLS", "") not in ("", "0", "false"):
            pytest.fail(reason)
        pytest.skip(reason)
    core = client.CoreV1Api(api)
    custom = client.CustomObjectsApi(api)
    custom.create_namespaced_custom_object("lmedge.io", "v1alpha1", WORKLOADS, "lmservices",
                                           _llama_service(realnode_tier))  # fmt: skip
    try:
        _serve_llama_stream(core)
    finally:
        custom.delete_namespaced_custom_object("lmedge.io", "v1alpha1", WORKLOADS, "lmservices",
                                               LLAMA_LM)  # fmt: skip
        wait_until(lambda: not _pods(core, WORKLOADS, f"lmedge.io/lm={LLAMA_LM}"), 120,
                   f"{LLAMA_LM}'s pod gone", 1.0)  # fmt: skip


def _serve_llama_stream(core: client.CoreV1Api) -> None:
    import openai

    pod = _ready_pod(core, _llama_pod, f"a Ready llama.cpp pod of {LLAMA_LM}")
    assert pod.spec.node_name == WORKERS[1].name
    (container,) = pod.spec.containers
    assert container.command is None and container.args[:4] == ["--model", "/models/model.gguf",
                                                                 "--alias", LLAMA_LM]  # fmt: skip
    origin = WORKERS[0]
    sdk = openai.OpenAI(base_url=f"http://{origin.ip}:8080/v1", api_key=_user_token(core),
                        timeout=120, max_retries=0)  # fmt: skip
    streamed: dict[str, Any] = {}
    errors: list[str] = []

    def answered() -> bool:
        # The gateways learn the new pod at the next slot's routing push: until
        # then worker-1's gateway may refuse the LM (nothing sent, no chunk).
        try:
            raw = sdk.chat.completions.with_raw_response.create(
                model=LLAMA_LM, stream=True, max_tokens=LLAMA_MAX_TOKENS,
                messages=[{"role": "user", "content": "Count from one to twenty in words."}],
            )  # fmt: skip
            pieces = [c.choices[0].delta.content for c in raw.parse() if c.choices
                      and c.choices[0].delta.content]  # fmt: skip
        except openai.APIError as exc:
            errors.append(f"{type(exc).__name__}: {exc}")
            return False
        streamed.update(id=raw.headers["x-lmedge-request-id"], pieces=pieces,
                        destination=raw.headers["x-lmedge-destination"])  # fmt: skip
        return True

    with _explained(core):
        try:
            wait_until(answered, 120, f"a streamed chat completion of {LLAMA_LM}", 3.0)
        except TimeoutError as exc:
            raise AssertionError(f"{exc}: {errors[-3:]}") from None
    assert streamed["destination"] == WORKERS[1].name, streamed
    assert len(streamed["pieces"]) >= 2, streamed
    store = _store(core)
    try:
        db = store.get_default_database()

        def recorded() -> dict[str, Any] | None:
            return db["requests"].find_one({"id": streamed["id"], "origin": origin.name})

        wait_until(lambda: recorded() is not None, 60, "the stream's record in the store", 1.0)
        record = recorded()
    finally:
        store.close()
    assert record is not None
    latency = sum(record[s] for s in ("uplink_s", "queue_s", "inference_s", "downlink_s"))
    print(f"{LLAMA_LM}: {len(streamed['pieces'])} chunks, ttft {record['ttft_s']:.3f} s, "
          f"latency {latency:.3f} s, tokens in {record['input_tokens']} "
          f"out {record['output_tokens']}")  # fmt: skip
    assert record["lm"] == LLAMA_LM and record["outcome"] == "success", record
    assert record["destination"] == WORKERS[1].name, record
    assert record["ttft_s"] is not None and 0 < record["ttft_s"] < latency, record
    assert 0 < record["output_tokens"] <= LLAMA_MAX_TOKENS, record
    # llama-server answers the usage the gateway asks for (stream_options.include_usage).
    assert record["input_tokens"] is not None and record["input_tokens"] > 0, record


def _prompts_run(pod_ip: str) -> float:
    text = httpx.get(f"http://{pod_ip}:8000/metrics", timeout=5).text
    match = re.search(rf'^lmedge_model_prompts_total\{{lm="{LM}"\}} (\S+)$', text, re.M)
    return float(match.group(1)) if match else 0.0


def _finished(path: Path) -> int:
    if not path.exists():
        return 0
    return sum(1 for line in path.read_text().splitlines()[1:] if line.endswith("}"))


def _model_server_pids(worker: Any, pod_uid: str = "") -> list[int]:
    """Model-server processes in the worker's pod cgroups (of one pod, given its uid)."""
    root = Path("/sys/fs/cgroup/pids") / worker.cgroup
    pids = []
    for procs in root.rglob("cgroup.procs"):
        if pod_uid and f"pod{pod_uid}" not in str(procs):
            continue
        for pid in procs.read_text().split():
            with contextlib.suppress(OSError):  # exited meanwhile
                if b"model-server" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    pids.append(int(pid))
    return pids


def _kill_model_server(tier: RealNodeTier, pod: Any) -> None:
    """SIGKILL the model server's process (not the pod): the kubelet restarts it."""
    worker = next(w for w in WORKERS if w.name == pod.spec.node_name)
    pids = _model_server_pids(worker, pod.metadata.uid)
    assert pids, f"no model-server process of pod {pod.metadata.name} on {worker.name}"
    for pid in pids:
        os.kill(pid, 9)


def test_killed_model_server_resumes_the_set_without_repeating_a_prompt(
    realnode_tier: RealNodeTier, api: client.ApiClient
) -> None:
    core = client.CoreV1Api(api)
    pod = _model_pod(core)
    worker = next(w for w in WORKERS if w.name == pod.spec.node_name)
    host_dir = realnode_tier.host_path(worker, progress_dir(LM))
    set_id = f"resume-{uuid.uuid4().hex[:6]}"
    progress = host_dir / f"{set_id}.jsonl"
    k = 8
    restarts = pod.status.container_statuses[0].restart_count
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pending = pool.submit(
            httpx.post,
            f"http://{WORKERS[0].ip}:8080/v1/prompt-sets",
            json={"id": set_id, "lm": LM, "prompts": [{"text": f"p{i}"} for i in range(k)]},
            headers={"Authorization": f"Bearer {_user_token(core)}"},
            timeout=180,
        )
        with _explained(core):
            wait_until(lambda: _finished(progress) >= 3, 60, "3 prompts finished", 0.1)
        # Written on the worker's hostPath by the model server's uid.
        assert progress.stat().st_uid == MODEL_UID
        assert host_dir.stat().st_uid == MODEL_UID
        _kill_model_server(realnode_tier, pod)
        done_before = _finished(progress)
        assert 3 <= done_before < k
        response = pending.result(timeout=180)
    assert response.status_code == 200, response.text
    result = response.json()
    assert result["outcome"] == "success" and result["prompts_done"] == k, result
    again = core.read_namespaced_pod(pod.metadata.name, WORKLOADS)
    # The same pod, its container restarted by the kubelet.
    assert again.status.container_statuses[0].restart_count > restarts
    # The new process ran exactly the prompts the killed one had not finished.
    assert _prompts_run(again.status.pod_ip) == k - done_before
    assert not progress.exists()


def test_helm_test_passes(
    realnode_tier: RealNodeTier, api: client.ApiClient, release: dict[str, Any]
) -> None:
    # No --logs: the chart's test pod is deleted once it succeeded (so
    # `helm uninstall` leaves no pod), and Helm then fails fetching its log.
    # A failed one is kept: its log goes into the failure message.
    done = helm(realnode_tier, "test", RELEASE, "-n", NS, "--timeout", "300s", check=False)
    if not re.search(r"Phase:\s+Succeeded", done):
        core = client.CoreV1Api(api)
        try:
            log = core.read_namespaced_pod_log(f"{RELEASE}-test-store", NS)
        except ApiException as exc:
            log = f"(no log: {exc.reason})"
        raise AssertionError(f"helm test failed:\n{done}\ntest pod log:\n{log}")


def test_helm_upgrade_keeps_the_tokens_and_the_data(
    realnode_tier: RealNodeTier, api: client.ApiClient, release: dict[str, Any]
) -> None:
    core = client.CoreV1Api(api)
    secrets = {(f"{RELEASE}-gateway-token", "token"), (f"{RELEASE}-mongodb", "password"),
               (f"{RELEASE}-store", "uri")}  # fmt: skip
    before = {name: _secret(core, name, key) for name, key in secrets}
    store = _store(core)
    try:
        requests_before = store.get_default_database()["requests"].count_documents({})
    finally:
        store.close()
    assert requests_before >= 2
    helm(realnode_tier, "upgrade", RELEASE, str(CHART), "-n", NS, *release["values"],
         "--set", "loop.epochSlots=6", "--wait", "--timeout", "600s")  # fmt: skip
    assert {name: _secret(core, name, key) for name, key in secrets} == before
    wait_until(lambda: all(_ready(p) for p in _pods(core, NS)), 300, "pods Ready again", 2.0)
    store = _store(core)
    try:
        assert store.get_default_database()["requests"].count_documents({}) >= requests_before
    finally:
        store.close()
    # The user token still opens the gateways.
    models = httpx.get(f"http://{WORKERS[1].ip}:8080/v1/models",
                       headers={"Authorization": f"Bearer {before[f'{RELEASE}-gateway-token']}"},
                       timeout=30)  # fmt: skip
    assert models.status_code == 200, models.text
    # The new controller found the EdgeNodes already there (no change to react to)
    # and still routes through both gateways: worker-1's set is served on worker-2.
    with _explained(core):
        reply = httpx.post(
            f"http://{WORKERS[0].ip}:8080/v1/chat/completions",
            json={"model": LM, "messages": [{"role": "user", "content": "after the upgrade"}]},
            headers={"Authorization": f"Bearer {before[f'{RELEASE}-gateway-token']}"},
            timeout=180,
        )  # fmt: skip
        assert reply.status_code == 200, reply.text
        assert reply.headers["x-lmedge-destination"] == WORKERS[1].name


def test_a_recreated_workload_namespace_serves_again_after_helm_upgrade(
    realnode_tier: RealNodeTier, api: client.ApiClient, release: dict[str, Any]
) -> None:
    core = client.CoreV1Api(api)
    custom = client.CustomObjectsApi(api)

    def lmservices() -> list[Any]:
        return list(custom.list_namespaced_custom_object("lmedge.io", "v1alpha1", WORKLOADS,
                                                         "lmservices")["items"])  # fmt: skip

    custom.delete_namespaced_custom_object("lmedge.io", "v1alpha1", WORKLOADS, "lmservices", LM)
    wait_until(lambda: not lmservices(), 120, "the LMService released", 1.0)
    core.delete_namespace(WORKLOADS)
    wait_until(lambda: WORKLOADS not in {n.metadata.name for n in core.list_namespace().items},
               180, f"namespace {WORKLOADS} deleted", 1.0)  # fmt: skip
    core.create_namespace({"metadata": {"name": WORKLOADS}})
    created = custom.create_namespaced_custom_object(
        "lmedge.io", "v1alpha1", WORKLOADS, "lmservices", yaml.safe_load(_services(realnode_tier))
    )
    uid = created["metadata"]["uid"]

    # The node agents' admission parameter lives beside the controller, so it
    # survived and follows the new LMService (it was in the workload
    # namespace and went with it: until a resync after `helm upgrade` the
    # images policy refused every model pod).
    def listed() -> bool:
        data = core.read_namespaced_config_map(f"{RELEASE}-model-images", NS).data or {}
        return data.get(f"{LM}.uid") == uid

    wait_until(listed, 60, f"{LM}'s new uid in the model-images ConfigMap", 1.0)
    # The release's objects in the workload namespace (the node agents' Role,
    # the model pods' account) went with it: `helm upgrade` puts them back.
    helm(realnode_tier, "upgrade", RELEASE, str(CHART), "-n", NS, *release["values"],
         "--wait", "--timeout", "600s")  # fmt: skip

    def serving() -> bool:
        pod = _model_pod(core)
        return pod is not None and _ready(pod)

    try:
        wait_until(serving, 300, f"a Ready model pod of the new {LM}", 2.0)
    except TimeoutError as exc:
        raise AssertionError(
            f"{exc}:\n{_describe(core, WORKLOADS)}\n{_describe(core, NS)}"
        ) from None
    pod = _model_pod(core)
    assert pod.spec.node_name == WORKERS[1].name
    assert [o.uid for o in pod.metadata.owner_references] == [uid]
    # The gateways learn the new pod's address at the next slot's push.
    replies: list[httpx.Response] = []

    def answered() -> bool:
        replies.append(httpx.post(
            f"http://{WORKERS[0].ip}:8080/v1/chat/completions",
            json={"model": LM, "messages": [{"role": "user", "content": "back again"}]},
            headers={"Authorization": f"Bearer {_user_token(core)}"}, timeout=120,
        ))  # fmt: skip
        return replies[-1].status_code == 200

    try:
        wait_until(answered, 90, "a chat completion through worker-1's gateway", 3.0)
    except TimeoutError as exc:
        raise AssertionError(
            f"{exc}: last reply {replies[-1].status_code} {replies[-1].text}"
        ) from None


#: The name the in-chart agent LLM answers to (agentLLM.model.name).
AGENT_MODEL = "gemma3-270m"


def test_the_in_chart_agent_llm_serves_the_controllers_planner(
    realnode_tier: RealNodeTier, api: client.ApiClient, release: dict[str, Any]
) -> None:
    """`agentLLM.enabled` with the agent-llm image `make images` built (llama-cpp-python
    and the Gemma 3 270M GGUF baked in): the server's pod comes up Ready, the chart
    points the controller at its Service, and the planner's LLM call is answered
    there, with the decision in the store. Only the planner asks the model (the
    rf profile's router and deployer stay deterministic), with its budget lifted
    off the 5-s slot: a CPU-hosted 270M model takes tens of seconds a call."""
    core = client.CoreV1Api(api)
    store = _store(core)
    try:
        runs_before = store.get_default_database()["runs"].count_documents({})
    finally:
        store.close()
    helm(realnode_tier, "upgrade", RELEASE, str(CHART), "-n", NS, *release["values"],
         "--set", "agentLLM.enabled=true", "--set", "agentLLM.model.baked=true",
         "--set", f"agentLLM.image={realnode_tier.images['agent-llm']}",
         "--set", f"agentLLM.model.name={AGENT_MODEL}", "--set", "agentLLM.chatTemplate=chatml",
         "--set", "agentLLM.parallel=1", "--set", "agentLLM.contextSize=4096",
         "--set", "agentLLM.resources.requests.cpu=100m",
         "--set", "agentLLM.resources.requests.memory=256Mi",
         "--set", "agentLLM.resources.limits.memory=2Gi",
         "--set", "policy.planner=agentic",
         "--set", "policy.params.planner.llm_slot_cap=off",
         "--set-string", "policy.params.planner.llm_timeout_s=600",
         "--set-string", "policy.params.planner.llm_budget_s=600",
         "--wait", "--timeout", "600s")  # fmt: skip
    (server,) = _pods(core, NS, "app.kubernetes.io/component=agent-llm")
    assert _ready(server), _describe(core, NS)
    (controller,) = [p for p in _pods(core, NS, "app.kubernetes.io/component=controller")
                     if p.metadata.deletion_timestamp is None]  # fmt: skip
    env = {e.name: e.value for c in controller.spec.containers for e in c.env or []}
    assert env.get("LMEDGE_LLM_BASE_URL") == f"http://{RELEASE}-agent-llm.{NS}.svc:8080/v1", env

    def answered() -> list[dict[str, Any]]:
        store = _store(core)
        try:
            db = store.get_default_database()
            if db["runs"].count_documents({}) <= runs_before:
                return []  # the restarted controller's run is not stored yet
            return [d for d in db["macro_policies"].find({"model": AGENT_MODEL})
                    if d.get("tokens_out", 0) > 0]  # fmt: skip
        finally:
            store.close()

    try:
        # a call takes ~30-60 s on two quiet cores, minutes on loaded ones (the file's
        # 1,500-s test timeout covers the upgrade and this wait)
        wait_until(answered, 780, "a planner decision answered by the in-chart agent LLM", 5.0)
    except TimeoutError as exc:
        store = _store(core)
        try:
            last = list(store.get_default_database()["macro_policies"].find().sort("_seq", -1)
                        .limit(2))  # fmt: skip
        finally:
            store.close()
        detail = f"last planner decisions {last}\n{_describe(core, NS)}"
        raise AssertionError(f"{exc}: {detail}") from None
    (first, *_) = answered()
    # The reply came through the agent's structured-output path and was parsed.
    assert first["parsed"] is True and first["tokens_in"] > 0, first


def test_helm_uninstall_leaves_no_pod(
    realnode_tier: RealNodeTier, api: client.ApiClient, release: dict[str, Any]
) -> None:
    core = client.CoreV1Api(api)
    custom = client.CustomObjectsApi(api)
    # The LMService is still there, with the operator's finalizer: the chart's
    # pre-delete hook deletes it while the operator runs (without the hook
    # the operator went first, the finalizer stayed, and the LMService, its
    # model pod and the namespace never went).
    (svc,) = custom.list_namespaced_custom_object("lmedge.io", "v1alpha1", WORKLOADS,
                                                  "lmservices")["items"]  # fmt: skip
    assert svc["metadata"].get("finalizers"), svc["metadata"]
    assert _model_pod(core) is not None
    out = helm(realnode_tier, "uninstall", RELEASE, "-n", NS, "--wait", "--timeout", "300s")
    release["uninstalled"] = True
    assert not custom.list_namespaced_custom_object("lmedge.io", "v1alpha1", WORKLOADS,
                                                    "lmservices")["items"], out  # fmt: skip

    def empty() -> bool:
        return not _pods(core, NS) and not _pods(core, WORKLOADS)

    wait_until(empty, 180, "no pod left in either namespace", 2.0)
    # The hook cleaned up after itself: no Job, account or Role of it is left.
    assert not client.BatchV1Api(api).list_namespaced_job(NS).items
    assert not [r for r in client.RbacAuthorizationV1Api(api).list_namespaced_role(WORKLOADS).items
                if r.metadata.name.endswith("-uninstall")]  # fmt: skip
    # The workload namespace can go (nothing holds it in Terminating).
    core.delete_namespace(WORKLOADS)
    wait_until(lambda: WORKLOADS not in {n.metadata.name for n in core.list_namespace().items},
               120, f"namespace {WORKLOADS} deleted", 1.0)  # fmt: skip
    # And no model server is left running on the workers either.
    for w in WORKERS:
        assert not _model_server_pids(w), w.name


def _serving_logs(core: client.CoreV1Api, lines: int = 40) -> str:
    """The controller's log and both gateways' logs, last lines each: what routed a set where."""
    out = []
    for component, container in (("controller", None), ("node-agent", "gateway")):
        for pod in _pods(core, NS, f"app.kubernetes.io/component={component}"):
            try:
                log = core.read_namespaced_pod_log(pod.metadata.name, NS, container=container,
                                                   tail_lines=lines)  # fmt: skip
            except ApiException as exc:
                log = f"(no log: {exc.reason})"
            out.append(f"--- {container or component} on {pod.spec.node_name}:\n{log}")
    return "\n".join(out)


@contextlib.contextmanager
def _explained(core: client.CoreV1Api) -> Iterator[None]:
    """Any failure inside comes with the pods' states and the serving logs."""
    try:
        yield
    except Exception as exc:
        raise AssertionError(
            f"{type(exc).__name__}: {exc}\n{_describe(core, NS)}\n{_describe(core, WORKLOADS)}"
            f"\n{_serving_logs(core)}"
        ) from exc


def _describe(core: client.CoreV1Api, ns: str) -> str:
    lines = []
    for pod in _pods(core, ns):
        statuses = [
            f"{s.name}: ready={s.ready} restarts={s.restart_count} "
            f"{(s.state.waiting and s.state.waiting.reason) or ''} "
            f"{(s.last_state.terminated and s.last_state.terminated.message) or ''}"
            for s in pod.status.container_statuses or []
        ]
        lines.append(f"{pod.metadata.name} on {pod.spec.node_name}: {pod.status.phase} {statuses}")
        for s in pod.status.container_statuses or []:
            if not s.ready:
                try:
                    log = core.read_namespaced_pod_log(pod.metadata.name, ns, container=s.name,
                                                       tail_lines=15)  # fmt: skip
                except ApiException as exc:
                    log = f"(no log: {exc.reason})"
                lines.append(f"  --- {s.name} log:\n{log}")
    events = core.list_namespaced_event(ns).items[-15:]
    lines += [f"  event {e.involved_object.name}: {e.reason} {e.message}" for e in events]
    return "\n".join(lines)
