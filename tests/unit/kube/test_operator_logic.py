"""The operator's plain functions: capacity checks and status building."""

from __future__ import annotations

from typing import Any

import pytest

from lmedge.api import EdgeNodeSpec, GPUSpec, LMServiceSpec
from lmedge.backends.kubernetes.pods import ObservedPod
from lmedge.errors import ManifestError
from lmedge.operator.logic import (
    ServiceStats,
    capacity_problems,
    edge_node_status,
    lmservice_status,
    parse_spec,
)

VALID_SERVICE = {
    "model": "gpt2",
    "modality": "text-to-text",
    "image": "img:1",
    "deploymentMemoryGib": 3,
    "minMemoryGib": 1,
    "runsOn": "gpu-only",
    "profile": {"gpuSecondsPerPrompt": 5},
}
DUAL = EdgeNodeSpec(
    cpu_cores=16, memory_gib=24, gpus=[GPUSpec(vram_gib=24), GPUSpec(vram_gib=24)], vgpus_per_gpu=2
)


@pytest.mark.parametrize(
    ("allocatable", "expected"),
    [
        ({"cpu": "16", "memory": "24Gi", "nvidia.com/gpu": "4"}, []),
        ({"cpu": "16", "memory": "25165824Ki", "nvidia.com/gpu": "4"}, []),
        ({"cpu": "15500m", "memory": "24Gi", "nvidia.com/gpu": "4"}, ["cpuCores=16"]),
        ({"cpu": "16", "memory": "16Gi", "nvidia.com/gpu": "4"}, ["memoryGib=24"]),
        ({"cpu": "16", "memory": "24Gi", "nvidia.com/gpu": "2"}, ["advertises 2"]),
        ({"cpu": "16", "memory": "24Gi"}, ["device plugin"]),
    ],
    ids=["fits", "kibibytes", "short-cpu", "short-memory", "no-time-slicing", "no-gpu-resource"],
)
def test_capacity_problems(allocatable: dict[str, str], expected: list[str]) -> None:
    problems = capacity_problems(DUAL, allocatable)
    assert len(problems) == len(expected)
    for problem, fragment in zip(problems, expected, strict=True):
        assert fragment in problem


def test_status_condition_reflects_problems() -> None:
    ok = edge_node_status(DUAL, [], 3)
    bad = edge_node_status(DUAL, ["too big"], 3)
    assert ok["vgpus"] == 4 and ok["observedGeneration"] == 3
    assert ok["conditions"][0]["status"] == "True"
    assert bad["conditions"][0]["status"] == "False"
    assert bad["conditions"][0]["message"] == "too big"


def test_parse_spec_names_the_field() -> None:
    with pytest.raises(ManifestError, match=r"LMService/lm9\.spec\.runsOn"):
        parse_spec(LMServiceSpec, {**VALID_SERVICE, "runsOn": "tpu"}, "LMService", "lm9")


def test_lmservice_status_counts_ready_pods_per_node() -> None:
    pods = [
        ObservedPod("a", "lm1", "w1", "h", "Running", True),
        ObservedPod("b", "lm1", "w2", "h", "Running", True),
        ObservedPod("c", "lm1", "w2", "h", "Pending", False),
        ObservedPod("d", "lm1", "w3", "h", "Running", True, deleting=True),
    ]
    status = lmservice_status(pods, ServiceStats(10, 0.7, 12.345, rejected=2), 1)
    assert status["activeInstances"] == 2
    assert status["instancesPerNode"] == {"w1": 1, "w2": 1}
    assert status["successRatio"] == 0.7
    assert status["meanLatencySeconds"] == 12.35
    assert status["rejectedRatio"] == 0.2


def test_lmservice_status_without_traffic_has_no_ratio() -> None:
    status = lmservice_status([], ServiceStats(0, None, None), 1)
    assert "successRatio" not in status and status["activeInstances"] == 0
    assert "rejectedRatio" not in status


def test_model_images_list_each_live_lmservice_image_and_uid() -> None:
    from lmedge.operator.logic import model_images

    services = [
        {"metadata": {"name": "lm1", "uid": "u1"}, "spec": {"image": "reg/lm1:1"}},
        {"metadata": {"name": "lm2", "uid": "u2", "deletionTimestamp": "x"},
         "spec": {"image": "reg/lm2:1"}},
        {"metadata": {"name": "lm3", "uid": "u3"}, "spec": {}},
    ]  # fmt: skip
    assert model_images(services) == {"lm1.image": "reg/lm1:1", "lm1.uid": "u1"}


def test_model_images_list_a_token_engines_kind_weights_and_claim() -> None:
    from lmedge.operator.logic import model_images

    def svc(name: str, engine: dict[str, Any] | None) -> dict[str, Any]:
        spec: dict[str, Any] = {"image": f"img/{name}"}
        if engine is not None:
            spec["engine"] = engine
        return {"metadata": {"name": name, "uid": f"u-{name}"}, "spec": spec}

    data = model_images([
        svc("p", None),
        svc("l", {"kind": "llama.cpp", "model": {"claimName": "g", "path": "/models/m.gguf"}}),
        svc("v", {"kind": "vllm"}),
        svc("bad", {"kind": "vllm", "model": {"path": "/models/../x"}}),
    ])  # fmt: skip

    assert data == {
        "bad.image": "img/bad", "bad.uid": "u-bad",
        "l.claim": "g", "l.engine": "llama.cpp", "l.image": "img/l", "l.model": "/models/m.gguf",
        "l.uid": "u-l", "p.image": "img/p", "p.uid": "u-p",
        "v.engine": "vllm", "v.image": "img/v", "v.model": "/models/model.gguf", "v.uid": "u-v",
    }  # fmt: skip
