"""Model pods of token engines: llama.cpp (GGUF baked or in a claim) and vLLM on a GPU."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from lmedge.api import LMPlacement, ServiceInfo
from lmedge.api.engines import pod_protocol
from lmedge.api.manifests import load_resources
from lmedge.api.resources import LMServiceSpec
from lmedge.backends.kubernetes.pods import (
    gpu_memory_utilization,
    model_pod,
    placement_hash,
)

REPO = Path(__file__).parents[3]
_, (LLAMA_EXAMPLE,) = load_resources(REPO / "examples" / "llama-cpp" / "lmservice.yaml")
GPU = LMPlacement(lm="x", mode="gpu", cpu_cores=2, vgpus=1)
CPU = LMPlacement(lm="x", mode="cpu", cpu_cores=2.5, vgpus=0)


def service(kind: str, model: dict[str, Any] | None = None, **tokens: Any) -> ServiceInfo:
    spec = LLAMA_EXAMPLE.spec.model_dump(by_alias=True, exclude_none=True)
    spec["engine"]["kind"] = kind
    spec["engine"]["tokens"].update(tokens)
    spec["engine"].pop("model")
    if model is not None:
        spec["engine"]["model"] = model
    if kind == "vllm":
        spec["image"] = "vllm/vllm-openai:v0.11.0"
    return ServiceInfo(name="x", spec=LMServiceSpec.model_validate(spec))


def container(pod: dict[str, Any]) -> dict[str, Any]:
    (c,) = pod["spec"]["containers"]
    return dict(c)


CLAIM = {"claimName": "gguf", "path": "/models/m.gguf"}
CLAIM_VOLUME = [{"name": "model", "persistentVolumeClaim": {"claimName": "gguf", "readOnly": True}}]
CLAIM_MOUNT = [{"name": "model", "mountPath": "/models", "readOnly": True}]

# (id, service, placement, args, volumes, mounts, env)
CASES = [
    ("llama.cpp-baked-gpu", service("llama.cpp"), GPU,
     ["--model", "/models/model.gguf", "--alias", "x", "--host", "0.0.0.0", "--port", "8000",
      "--ctx-size", "32768", "--parallel", "8", "--threads", "2", "--n-gpu-layers", "999",
      "--kv-unified", "--kv-unified-per-slot", "4096", "--ctx-checkpoints", "0", "--metrics"],
     [], None, None),
    # 3 GiB - 1 GiB of weights = 65,536 tokens of 32 KiB: 4 contexts of 16,384, not 8.
    ("llama.cpp-claim-cpu", service("llama.cpp", CLAIM, contextTokens=16384), CPU,
     ["--model", "/models/m.gguf", "--alias", "x", "--host", "0.0.0.0", "--port", "8000",
      "--ctx-size", "65536", "--parallel", "4", "--threads", "3", "--n-gpu-layers", "0",
      "--kv-unified", "--kv-unified-per-slot", "16384", "--ctx-checkpoints", "0", "--metrics"],
     CLAIM_VOLUME, CLAIM_MOUNT, None),
    # minVramGib 3 of a 24 GiB GPU: 0.125.
    ("vllm-claim-gpu", service("vllm", {"claimName": "w", "path": "/models/llama"}), GPU,
     ["--model", "/models/llama", "--served-model-name", "x", "--host", "0.0.0.0",
      "--port", "8000", "--max-num-seqs", "8", "--max-model-len", "4096",
      "--gpu-memory-utilization", "0.125"],
     [{"name": "model", "persistentVolumeClaim": {"claimName": "w", "readOnly": True}}],
     CLAIM_MOUNT, [{"name": "HOME", "value": "/tmp"}]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("svc", "placement", "args", "volumes", "mounts", "env"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_token_engine_pods_run_the_image_entrypoint_with_derived_flags(
    svc: ServiceInfo,
    placement: LMPlacement,
    args: list[str],
    volumes: list[dict[str, Any]],
    mounts: list[dict[str, Any]] | None,
    env: list[dict[str, str]] | None,
) -> None:
    pod = model_pod(svc, placement, "w1", "ns", owner_uid="u", gpu_vram_gib=24)
    c = container(pod)

    assert "command" not in c
    assert c["image"] == svc.spec.image
    assert c["args"] == args
    assert pod["spec"]["volumes"] == volumes
    assert c.get("volumeMounts") == mounts
    assert c.get("env") == env
    assert c["ports"] == [{"name": "http", "containerPort": 8000}]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"] == {"path": "/health", "port": "http"}
    assert c["startupProbe"]["periodSeconds"] * c["startupProbe"]["failureThreshold"] == 600
    gpus = c["resources"]["limits"].get("nvidia.com/gpu")
    assert gpus == ("1" if placement.mode == "gpu" else None)
    assert c["resources"]["requests"] == c["resources"]["limits"]


def test_token_engine_pods_keep_every_pod_guarantee() -> None:
    pod = model_pod(service("vllm"), GPU, "w1", "ns", owner_uid="u", service_account="m")
    spec = pod["spec"]
    assert (spec["nodeName"], spec["serviceAccountName"]) == ("w1", "m")
    assert spec["automountServiceAccountToken"] is False
    assert spec["securityContext"]["runAsUser"] == 10001
    assert container(pod)["securityContext"]["allowPrivilegeEscalation"] is False
    assert pod["metadata"]["ownerReferences"][0]["uid"] == "u"
    assert pod["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "lmedge-node-agent"


@pytest.mark.parametrize(
    ("vram", "expected"),
    [(24, 0.125), (3, 0.95), (7, 0.428), (None, 0.9)],
    ids=["share", "capped", "rounded-down", "unknown-gpu"],
)
def test_vllm_gpu_memory_utilization_is_the_pods_share_of_one_gpu(
    vram: float | None, expected: float
) -> None:
    assert gpu_memory_utilization(service("vllm").spec, vram) == expected


def test_vllm_on_cpu_has_no_gpu_memory_flag() -> None:
    args = container(model_pod(service("vllm"), CPU, "w1", "ns"))["args"]
    assert "--gpu-memory-utilization" not in args
    assert args[-4:] == ["--max-num-seqs", "8", "--max-model-len", "4096"]


def test_editing_the_engine_replaces_token_pods() -> None:
    a, b = service("llama.cpp"), service("llama.cpp", contextTokens=2048)
    assert placement_hash(GPU, a.spec) != placement_hash(GPU, b.spec)
    moved = service("llama.cpp", {"path": "/opt/other.gguf"})
    assert placement_hash(GPU, a.spec) != placement_hash(GPU, moved.spec)


def test_the_probe_objects_are_not_shared() -> None:
    c = container(model_pod(service("llama.cpp"), GPU, "w1", "ns"))
    c["readinessProbe"]["httpGet"]["path"] = "/x"
    assert c["livenessProbe"]["httpGet"]["path"] == "/health"


@pytest.mark.parametrize(
    ("kind", "protocol"),
    [("pipeline", "pipeline"), ("llama.cpp", "openai"), ("vllm", "openai")],
)
def test_token_engine_pods_speak_openai(kind: Any, protocol: str) -> None:
    assert pod_protocol(kind) == protocol


def test_the_example_is_a_claim_served_llama_cpp_pod() -> None:
    pod = model_pod(LLAMA_EXAMPLE, GPU, "w1", "ns")
    assert container(pod)["args"][:2] == ["--model", "/models/Llama-3.2-1B-Instruct-Q4_K_M.gguf"]
    spec = copy.deepcopy(pod["spec"]["volumes"])
    assert spec == [{"name": "model", "persistentVolumeClaim": {"claimName": "llama-1b-gguf",
                                                                 "readOnly": True}}]  # fmt: skip


@pytest.mark.parametrize(
    ("kind", "model", "error"),
    [
        ("llama.cpp", {"claimName": "c", "path": "/opt/m.gguf"}, "must lie under /models/"),
        ("llama.cpp", {"path": "/models/../etc/shadow"}, "must not contain .."),
        ("llama.cpp", {"path": "models/m.gguf"}, "should match pattern"),
        ("llama.cpp", {"path": "/models/m.gguf --api-key x"}, "should match pattern"),
        ("pipeline", {"path": "/models/m.gguf"}, "engine.model is only for llama.cpp and vllm"),
    ],
    ids=["claim-outside-mount", "dot-dot", "relative", "flag-in-path", "pipeline"],
)
def test_a_bad_model_source_names_the_problem(kind: str, model: dict[str, Any], error: str) -> None:
    spec = LLAMA_EXAMPLE.spec.model_dump(by_alias=True, exclude_none=True)
    spec["engine"]["model"] = model
    spec["engine"]["kind"] = kind
    if kind == "pipeline":
        del spec["engine"]["tokens"]
    with pytest.raises(ValueError, match=error):
        LMServiceSpec.model_validate(spec)
