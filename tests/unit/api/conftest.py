"""A small cluster whose every capacity edge is known by heart.

Nodes: `control` (8 cores, 16 GiB, no LMs); `cpu` (24 cores, 32 GiB, no GPU);
`gpu` (16 cores, 24 GiB, one 24 GiB GPU x 2 vGPUs); `small` (6 cores, 8 GiB,
one 8 GiB GPU x 1 vGPU); `vram` (16 cores, 24 GiB, one 4 GiB GPU x 4 vGPUs:
vRAM runs out first). LMs: `txt` (cpu-or-gpu, 3 GiB), `big` (cpu-or-gpu,
9 GiB: too big for `small`), `img` (gpu-only, 2.5 GiB, 2 GiB
vRAM), `gen` (gpu-only, 3.5 GiB, 6 GiB vRAM, up to 2 vGPUs).
"""

from __future__ import annotations

from typing import Any

import pytest

from lmedge.api import (
    ClusterContext,
    EdgeNodeSpec,
    LMServiceSpec,
    NodeInfo,
    ServiceInfo,
)


def node(name: str, **spec: Any) -> NodeInfo:
    return NodeInfo(name=name, spec=EdgeNodeSpec.model_validate(spec))


def service(name: str, runs_on: str, dep: float, vram: float = 0.0, **extra: Any) -> ServiceInfo:
    profile: dict[str, Any] = {"gpuSecondsPerPrompt": 5.0}
    if runs_on == "cpu-or-gpu":
        profile["cpuSecondsPerPrompt"] = 8.0
    spec = {
        "model": name,
        "modality": "text-to-text",
        "image": f"example/{name}:1",
        "deploymentMemoryGib": dep,
        "minMemoryGib": dep / 2,
        "minVramGib": vram,
        "runsOn": runs_on,
        "profile": profile,
        **extra,
    }
    return ServiceInfo(name=name, spec=LMServiceSpec.model_validate(spec))


NODES = [
    node("control", role="control", cpuCores=8, memoryGib=16),
    node("cpu", cpuCores=24, memoryGib=32),
    node("gpu", cpuCores=16, memoryGib=24, gpus=[{"vramGib": 24}], vgpusPerGpu=2),
    node("small", cpuCores=6, memoryGib=8, gpus=[{"vramGib": 8}], vgpusPerGpu=1),
    node("vram", cpuCores=16, memoryGib=24, gpus=[{"vramGib": 4}], vgpusPerGpu=4),
]
SERVICES = [
    service("txt", "cpu-or-gpu", 3.0, 1.0),
    service("big", "cpu-or-gpu", 9.0, 3.5),
    service("img", "gpu-only", 2.5, 2.0),
    service("gen", "gpu-only", 3.5, 6.0, maxVgpus=2),
]


@pytest.fixture
def ctx() -> ClusterContext:
    return ClusterContext(nodes=NODES, services=SERVICES)
