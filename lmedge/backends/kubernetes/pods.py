"""Model pods from placements, and the actions that reconcile a node to one.

Pure functions, no API calls: the backend and the node agent call them and
then talk to the API server. One LM per pod, pinned to its node with
`spec.nodeName`; CPU requests = limits as decided; memory = the service's
deployment memory; `nvidia.com/gpu` = vGPUs. The pod name carries a short hash
of (mode, cores, vGPUs), so a resize is a new pod (created after the old one
is deleted) and re-applying the same placement yields the same names: nothing
changes, which makes actuation idempotent.

The container depends on the LMService's `engine.kind` (`engine_container`):
`pipeline` runs lmedge's model server (`images/model-server`) with its
progress directory; `llama.cpp` and `vllm` run the OpenAI-compatible server
of the image (llama-server, the vLLM OpenAI server) on the same port, with
flags derived from the token profile (`llama_cpp_args`, `vllm_args`), the
weights baked into the image or in the LMService's claim, mounted read-only.

The manifest is exactly what the node agent's admission policy admits
(charts/lmedge/templates/admission-policy.yaml): the model-pod labels, an
owner reference to the LMService, the LMService's image run through its own
entrypoint (args only, no `command`, in the shape the builder for the
LMService's engine emits), a service account without a token, no host
namespaces or ports, no privilege, non-root, no environment but vLLM's HOME,
and no volume but the LM's progress directory on the host (pipeline) or the
LMService's own claim, read-only (token engines). Change both together.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from lmedge.api import LMPlacement, LMServiceSpec, Placement, ServiceInfo
from lmedge.api.engines import MODEL_MOUNT, concurrent_requests, kv_pool_gib

GPU_RESOURCE = "nvidia.com/gpu"
LABEL_LM = "lmedge.io/lm"
LABEL_NODE = "lmedge.io/node"
LABEL_MODE = "lmedge.io/mode"
ANNOTATION_HASH = "lmedge.io/placement-hash"
#: `app.kubernetes.io/managed-by` of every model pod; the admission policy keys on it.
MANAGED_BY = "lmedge-node-agent"
MODEL_PORT = 8000
#: Host directory holding one progress subdirectory per LM; the model image's
#: entrypoint uses the same path inside the container (images/model-server).
PROGRESS_HOST_PATH = "/var/lib/lmedge/progress"
#: The model-server image's user (images/model-server/Dockerfile); every model pod runs as it.
MODEL_UID = 10001
#: llama.cpp's `--n-gpu-layers` for "every layer on the GPU".
ALL_LAYERS = 999
#: vLLM's own default `--gpu-memory-utilization`, used when the GPU's vRAM is unknown.
VLLM_DEFAULT_UTILIZATION = 0.9
#: $HOME of a vLLM pod (see `_vllm`); the admission policy admits this one variable.
VLLM_HOME = "/tmp"
#: Startup probes (5 s apart) a token engine has to load its weights: 10 minutes.
STARTUP_PROBES = 120


@dataclass(frozen=True)
class ObservedPod:
    """The parts of a live pod the reconciler needs."""

    name: str
    lm: str
    node: str
    placement_hash: str
    phase: str
    ready: bool
    deleting: bool = False
    #: What the pod holds (from its container requests); 0 when unknown.
    mode: str = ""
    cpu_cores: float = 0.0
    memory_gib: float = 0.0
    vgpus: int = 0
    ip: str = ""

    @property
    def pending(self) -> bool:
        """Starting and not yet serving: the pending rule looks at these."""
        return not self.deleting and not self.ready and self.phase in ("Pending", "Running")


@dataclass
class NodeActions:
    """What to do on one node to reach a placement."""

    create: list[LMPlacement] = field(default_factory=list)
    delete: list[str] = field(default_factory=list)
    voided: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)


def placement_hash(p: LMPlacement, spec: LMServiceSpec | None = None) -> str:
    """What a pod runs, in six hex digits: its resources and, given `spec`, its LMService's.

    The spec's part is what the pod manifest takes from it (model, modality,
    image, memory): editing one of those makes running pods differ from the
    placement, so the reconcile replaces them. Fields that only steer the
    planners (profile, runsOn, maxVgpus, ...) change placements, not pods.
    """
    key = f"{p.mode}/{p.cpu_cores:g}/{p.vgpus}"
    if spec is not None:
        key += f"/{spec.model}/{spec.modality}/{spec.image}/{spec.deployment_memory_gib:g}"
        if spec.engine.kind != "pipeline":
            # Its server flags come from the engine spec (pipeline keys stay as they were).
            key += f"/{spec.min_vram_gib:g}/" + spec.engine.model_dump_json()
    return hashlib.sha256(key.encode()).hexdigest()[:6]


def pod_name(lm: str, node: str, p: LMPlacement, spec: LMServiceSpec | None = None) -> str:
    base = f"{lm}-{node}"
    if len(base) > 50:
        base = base[:43] + "-" + hashlib.sha256(base.encode()).hexdigest()[:6]
    return f"{base}-{placement_hash(p, spec)}"


def _cpu_quantity(cores: float) -> str:
    millis = round(cores * 1000)
    return f"{millis // 1000}" if millis % 1000 == 0 else f"{millis}m"


def _mem_quantity(gib: float) -> str:
    return f"{round(gib * 1024)}Mi"


def model_pod(
    service: ServiceInfo,
    placement: LMPlacement,
    node: str,
    namespace: str,
    owner_uid: str | None = None,
    extra_labels: dict[str, str] | None = None,
    service_account: str | None = None,
    gpu_vram_gib: float | None = None,
) -> dict[str, Any]:
    """The Pod manifest serving `service` on `node` with `placement`'s resources.

    `service_account` is the model pods' own account (the chart's
    `<release>-model`, which holds no permissions); None keeps the
    namespace's `default` one. Either way no token is mounted. The container
    is the engine's (`engine_container`); `gpu_vram_gib` is the vRAM of one of
    the node's GPUs, which a vLLM pod's memory share is a fraction of.
    """
    spec = service.spec
    resources: dict[str, str] = {
        "cpu": _cpu_quantity(placement.cpu_cores),
        "memory": _mem_quantity(spec.deployment_memory_gib),
    }
    if placement.mode == "gpu":
        resources[GPU_RESOURCE] = str(placement.vgpus)
    labels = {
        "app.kubernetes.io/name": "lmedge-model",
        "app.kubernetes.io/instance": service.name,
        "app.kubernetes.io/component": "model-server",
        "app.kubernetes.io/part-of": "lmedge",
        "app.kubernetes.io/managed-by": MANAGED_BY,
        LABEL_LM: service.name,
        LABEL_NODE: node,
        LABEL_MODE: placement.mode,
        **(extra_labels or {}),
    }
    metadata: dict[str, Any] = {
        "name": pod_name(service.name, node, placement, spec),
        "namespace": namespace,
        "labels": labels,
        "annotations": {ANNOTATION_HASH: placement_hash(placement, spec)},
    }
    if owner_uid:
        metadata["ownerReferences"] = [
            {
                "apiVersion": "lmedge.io/v1alpha1",
                "kind": "LMService",
                "name": service.name,
                "uid": owner_uid,
                "controller": True,
                "blockOwnerDeletion": False,
            }
        ]
    container, volumes = engine_container(service, placement, gpu_vram_gib)
    container = {
        "name": "model-server",
        "image": spec.image,
        **container,
        "resources": {"requests": dict(resources), "limits": dict(resources)},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
        },
    }
    pod_spec: dict[str, Any] = {
        "nodeName": node,
        "restartPolicy": "Always",
        # A model server never calls the API server.
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": 10,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": MODEL_UID,
            "runAsGroup": MODEL_UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "tolerations": [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}],
        "volumes": volumes,
    }
    if service_account:
        pod_spec["serviceAccountName"] = service_account
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": pod_spec}


_PROBE = {"periodSeconds": 2, "failureThreshold": 3}
_PORTS = [{"name": "http", "containerPort": MODEL_PORT}]


def engine_container(
    service: ServiceInfo, placement: LMPlacement, gpu_vram_gib: float | None = None
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The engine's part of the model container (args, ports, probes, mounts) and its volumes.

    One builder per `engine.kind`; `model_pod` adds what every model pod has
    (image, resources, security). What a builder emits is exactly what the
    node agent's admission policy admits for that kind.
    """
    engine = service.spec.engine
    if engine.kind == "llama.cpp":
        return _llama_cpp(service, placement)
    if engine.kind == "vllm":
        return _vllm(service, placement, gpu_vram_gib)
    return _pipeline(service, placement)


def _pipeline(
    service: ServiceInfo, placement: LMPlacement
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    container = {
        # Flags for the image's entrypoint, which already runs `lmedge model-server`
        # with the weights baked into the image and the progress directory.
        "args": [
            "--lm",
            service.name,
            "--modality",
            service.spec.modality,
            "--device",
            "cuda" if placement.mode == "gpu" else "cpu",
        ],
        "ports": list(_PORTS),
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": "http"}, **_PROBE},
        "livenessProbe": {
            "httpGet": {"path": "/healthz", "port": "http"},
            "initialDelaySeconds": 30,
            **_PROBE,
        },
        "volumeMounts": [{"name": "progress", "mountPath": PROGRESS_HOST_PATH}],
    }
    volumes = [
        {
            "name": "progress",
            # The node agent creates it owned by MODEL_UID when it has the
            # host directory mounted (the chart's node agent does); else the
            # kubelet creates it, root-owned, and the model server's
            # readiness says it cannot write there.
            "hostPath": {"path": progress_dir(service.name), "type": "DirectoryOrCreate"},
        }
    ]
    return container, volumes


def _token_engine_parts(
    service: ServiceInfo, args: list[str], env: list[dict[str, str]] | None = None
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Probes, port, env and the model claim shared by the token engines (both answer /health)."""

    def health(**timing: int) -> dict[str, Any]:
        return {"httpGet": {"path": "/health", "port": "http"}, **timing}

    container: dict[str, Any] = {
        "args": args,
        "ports": list(_PORTS),
        # Loading weights takes minutes for a large model: the startup probe
        # holds liveness off until the server first answers.
        "startupProbe": health(periodSeconds=5, failureThreshold=STARTUP_PROBES),
        "readinessProbe": health(**_PROBE),
        "livenessProbe": health(periodSeconds=10, failureThreshold=3),
    }
    if env:
        container["env"] = env
    volumes: list[dict[str, Any]] = []
    weights = service.spec.engine.weights
    if weights.claim_name is not None:
        container["volumeMounts"] = [{"name": "model", "mountPath": MODEL_MOUNT, "readOnly": True}]
        volumes.append(
            {
                "name": "model",
                "persistentVolumeClaim": {"claimName": weights.claim_name, "readOnly": True},
            }
        )
    return container, volumes


def llama_cpp_args(service: ServiceInfo, placement: LMPlacement) -> list[str]:
    """llama-server's flags for a pod of `service` with `placement` (its image's entrypoint).

    `--parallel` slots share `--ctx-size` tokens of KV equally, so each slot
    gets a full `contextTokens` context: parallel = min(maxRunningSequences,
    KV pool / contextTokens) (at least 1) and ctx-size = contextTokens x
    parallel, which keeps the KV llama.cpp allocates inside the pool the
    token profile budgets (`kv_capacity_tokens`). All layers on the GPU in
    GPU mode, none in CPU mode; one thread per whole core of the placement.

    The server runs as `lmedge calibrate --engine llama.cpp` measured it, so
    the token profile predicts it: one KV cache for all slots
    (`--kv-unified`), so a batch of new prompts beside running sequences is
    one forward pass (with a cache per slot llama.cpp splits a mixed batch
    into several), each sequence still held to `contextTokens`
    (`--kv-unified-per-slot`); and no context checkpoints
    (`--ctx-checkpoints 0`), so a sliding-window model (Gemma 3) prefills a
    prompt in one iteration instead of stopping short of its end to snapshot
    the window.
    """
    tokens = service.spec.engine.tokens
    assert tokens is not None  # EngineSpec requires it for llama.cpp
    parallel = concurrent_requests(service.spec, "gpu" if placement.mode == "gpu" else "cpu")
    threads = max(1, math.ceil(placement.cpu_cores - 1e-9))
    return [
        "--model", service.spec.engine.weights.path,
        "--alias", service.name,
        "--host", "0.0.0.0",
        "--port", str(MODEL_PORT),
        "--ctx-size", str(tokens.context_tokens * parallel),
        "--parallel", str(parallel),
        "--threads", str(threads),
        "--n-gpu-layers", str(ALL_LAYERS if placement.mode == "gpu" else 0),
        "--kv-unified",
        "--kv-unified-per-slot", str(tokens.context_tokens),
        "--ctx-checkpoints", "0",
        "--metrics",
    ]  # fmt: skip


def _llama_cpp(
    service: ServiceInfo, placement: LMPlacement
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    return _token_engine_parts(service, llama_cpp_args(service, placement))


def gpu_memory_utilization(spec: LMServiceSpec, gpu_vram_gib: float | None) -> float:
    """vLLM's `--gpu-memory-utilization`: the share of one GPU the pod reserves.

    (weights + KV pool) / the GPU's vRAM, the memory the deployers budget
    for the pod (`minVramGib` when `kvCacheGib` is unset), rounded down to
    three digits and at most 0.95 (CUDA context and activations need the
    rest); vLLM's default 0.9 when the GPU's vRAM is unknown.
    """
    tokens = spec.engine.tokens
    if tokens is None or gpu_vram_gib is None or gpu_vram_gib <= 0:
        return VLLM_DEFAULT_UTILIZATION
    held = tokens.weights_gib + kv_pool_gib(tokens, spec.min_vram_gib)
    return max(0.001, min(0.95, math.floor(held / gpu_vram_gib * 1000) / 1000))


def vllm_args(
    service: ServiceInfo, placement: LMPlacement, gpu_vram_gib: float | None = None
) -> list[str]:
    """The vLLM OpenAI server's flags for a pod of `service` (its image's entrypoint).

    `--max-num-seqs` = maxRunningSequences, `--max-model-len` = contextTokens;
    on a GPU, `--gpu-memory-utilization` (`gpu_memory_utilization`), which
    sizes vLLM's KV pool to the one the token profile budgets.
    """
    tokens = service.spec.engine.tokens
    assert tokens is not None  # EngineSpec requires it for vllm
    args = [
        "--model", service.spec.engine.weights.path,
        "--served-model-name", service.name,
        "--host", "0.0.0.0",
        "--port", str(MODEL_PORT),
        "--max-num-seqs", str(tokens.max_running_sequences),
        "--max-model-len", str(tokens.context_tokens),
    ]  # fmt: skip
    if placement.mode == "gpu":
        util = gpu_memory_utilization(service.spec, gpu_vram_gib)
        args += ["--gpu-memory-utilization", f"{util:.3f}"]
    return args


def _vllm(
    service: ServiceInfo, placement: LMPlacement, gpu_vram_gib: float | None
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    # The image runs as MODEL_UID, which has no home directory in it: vLLM's
    # and Triton's caches go under $HOME, so HOME is the writable /tmp.
    env = [{"name": "HOME", "value": VLLM_HOME}]
    return _token_engine_parts(service, vllm_args(service, placement, gpu_vram_gib), env)


def progress_dir(lm: str, root: str = PROGRESS_HOST_PATH) -> str:
    """The host directory of `lm`'s resumable progress."""
    return f"{root}/{lm}"


def plan_node(
    desired: Placement,
    observed: Sequence[ObservedPod],
    services: Mapping[str, ServiceInfo] | Iterable[str],
) -> NodeActions:
    """Actions turning the node's observed model pods into `desired`.

    `services` are the LMServices that exist; given as {name: ServiceInfo},
    a pod made from an older spec of its LMService (`placement_hash`) is
    replaced too. Pods whose LM is off, or whose resources differ, are deleted; missing
    ones are created. The pending rule (paper §V-D2): while any pod on the
    node is still pending, creations — resource-adding actions — are voided;
    deletions still go ahead. Pods already being deleted are ignored, and a
    duplicate pod for one LM (e.g. left by a crash mid-slot) is deleted.
    """
    known = set(services)
    specs = (
        {n: s.spec for n, s in services.items() if isinstance(s, ServiceInfo)}
        if isinstance(services, Mapping)
        else {}
    )
    actions = NodeActions()
    live = [p for p in observed if not p.deleting and p.node == desired.node]
    want = {p.lm: p for p in desired.lms if p.mode != "off" and p.lm in known}
    kept: set[str] = set()
    for pod in sorted(live, key=lambda p: (p.lm, not p.ready, p.name)):
        target = want.get(pod.lm)
        wanted = None if target is None else placement_hash(target, specs.get(pod.lm))
        if target is None or pod.placement_hash != wanted or pod.lm in kept:
            actions.delete.append(pod.name)
        else:
            kept.add(pod.lm)
            actions.unchanged.append(pod.lm)
    pending = any(p.pending for p in live if p.name not in actions.delete)
    for lm, target in want.items():
        if lm in kept:
            continue
        if pending:
            actions.voided.append(lm)
        else:
            actions.create.append(target)
    return actions


def parse_cpu(q: str | int | float) -> float:
    """CPU cores from a quantity ("4", "2500m")."""
    text = str(q)
    return int(text[:-1]) / 1000 if text.endswith("m") else float(text)


_MEMORY_UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6,
                 "G": 10**9, "T": 10**12}  # fmt: skip


def parse_memory_gib(q: str | int | float) -> float:
    """GiB from a memory quantity ("3584Mi", "3Gi", bytes)."""
    text = str(q)
    for suffix in sorted(_MEMORY_UNITS, key=len, reverse=True):
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * _MEMORY_UNITS[suffix] / 2**30
    return float(text) / 2**30


def observe_pod(pod: Mapping[str, Any]) -> ObservedPod:
    """The reconciler's view of a pod given as its JSON object (API field names)."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    labels = meta.get("labels") or {}
    conditions = status.get("conditions") or []
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    cpu = memory = 0.0
    vgpus = 0
    for container in spec.get("containers") or []:
        requests = (container.get("resources") or {}).get("requests") or {}
        cpu += parse_cpu(requests.get("cpu", 0))
        memory += parse_memory_gib(requests.get("memory", 0))
        vgpus += int(requests.get(GPU_RESOURCE, 0))
    return ObservedPod(
        name=str(meta.get("name", "")),
        lm=str(labels.get(LABEL_LM, "")),
        node=str(spec.get("nodeName") or labels.get(LABEL_NODE, "")),
        placement_hash=str((meta.get("annotations") or {}).get(ANNOTATION_HASH, "")),
        phase=str(status.get("phase") or "Pending"),
        ready=ready,
        deleting=meta.get("deletionTimestamp") is not None,
        mode=str(labels.get(LABEL_MODE, "")),
        cpu_cores=cpu,
        memory_gib=memory,
        vgpus=vgpus,
        ip=str(status.get("podIP") or ""),
    )
