"""Building scenarios in code: manifest builders and a synthetic cluster for scale.

Used by `tools/make-large-scenario.py` (the committed `examples/large/`), by
the benchmarks (10 / 100 / 1,000 workers) and by tests that need a small,
exact cluster. Everything produced here is ordinary manifest YAML, loadable
with `load_scenario` like a hand-written scenario.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from lmedge.api.manifests import API


def edge_node(
    name: str,
    *,
    cores: float = 16,
    memory_gib: float = 24,
    gpus: int = 0,
    vram_gib: float = 24,
    vgpus_per_gpu: int = 2,
    site: str = "site-a",
    role: str = "worker",
    links: Sequence[tuple[str, float, float]] = (),
    intra_mbps: float = 10_000,
    intra_ms: float = 0.5,
) -> dict[str, Any]:
    """An EdgeNode manifest; `links` = [(site, bandwidth Mbit/s, latency ms), ...]."""
    spec: dict[str, Any] = {
        "role": role,
        "cpuCores": cores,
        "memoryGib": memory_gib,
        "site": site,
        "intraSiteBandwidthMbps": intra_mbps,
        "intraSiteLatencyMs": intra_ms,
    }
    if gpus:
        spec["gpus"] = [{"model": "NVIDIA-A5000", "vramGib": vram_gib} for _ in range(gpus)]
        spec["vgpusPerGpu"] = vgpus_per_gpu
    if links:
        spec["links"] = [{"site": s, "bandwidthMbps": bw, "latencyMs": lat} for s, bw, lat in links]
    return {"apiVersion": API, "kind": "EdgeNode", "metadata": {"name": name}, "spec": spec}


def lm_service(
    name: str,
    *,
    gpu_s: float = 5.0,
    cpu_s: float | None = 8.0,
    runs_on: str = "cpu-or-gpu",
    memory_gib: float = 3.0,
    min_memory_gib: float = 1.0,
    vram_gib: float = 1.0,
    cores: float = 4,
    max_vgpus: int = 2,
    request_kib: float = 1.0,
    response_kib: float = 1.0,
    deadline_s: float | None = None,
) -> dict[str, Any]:
    """An LMService manifest with the given profile."""
    profile: dict[str, Any] = {
        "gpuSecondsPerPrompt": gpu_s,
        "requestKib": request_kib,
        "responseKib": response_kib,
    }
    if cpu_s is not None and runs_on == "cpu-or-gpu":
        profile["cpuSecondsPerPrompt"] = cpu_s
    spec: dict[str, Any] = {
        "model": name,
        "modality": "text-to-text",
        "image": f"example.invalid/{name}:0",
        "minMemoryGib": min_memory_gib,
        "deploymentMemoryGib": memory_gib,
        "minVramGib": vram_gib,
        "runsOn": runs_on,
        "defaultCpuCores": cores,
        "maxVgpus": max_vgpus,
        "profile": profile,
    }
    if deadline_s is not None:
        spec["deadlineS"] = deadline_s
    return {"apiVersion": API, "kind": "LMService", "metadata": {"name": name}, "spec": spec}


def scenario_doc(name: str, **sections: Any) -> dict[str, Any]:
    """A `kind: Scenario` document; `sections` are its top-level camelCase fields."""
    return {"apiVersion": API, "kind": "Scenario", "metadata": {"name": name}, **sections}


def write_scenario(
    folder: Path,
    nodes: Sequence[dict[str, Any]],
    services: Sequence[dict[str, Any]] | Path,
    scenario: dict[str, Any] | None = None,
    header: str = "",
) -> Path:
    """Write nodes.yaml, services.yaml (or copy a services file) and scenario.yaml."""
    folder.mkdir(parents=True, exist_ok=True)
    prefix = "".join(f"# {line}\n" for line in header.splitlines())
    (folder / "nodes.yaml").write_text(prefix + yaml.safe_dump_all(nodes, sort_keys=False))
    if isinstance(services, Path):
        (folder / "services.yaml").write_text(services.read_text())
    else:
        (folder / "services.yaml").write_text(yaml.safe_dump_all(services, sort_keys=False))
    if scenario is not None:
        (folder / "scenario.yaml").write_text(prefix + yaml.safe_dump(scenario, sort_keys=False))
    return folder


def synthetic_cluster(
    workers: int, sites: int, *, cross_mbps: float = 1000, cross_ms: float = 2
) -> list[dict[str, Any]]:
    """A control node plus `workers` workers spread round-robin over `sites` sites.

    Hardware repeats Table I's mix in blocks of six: one CPU-only worker
    (24 cores, 32 GiB), four single-GPU and one dual-GPU worker (16 cores,
    24 GiB, A5000 24 GiB, 2 vGPUs per GPU). Every site links to every other.
    """
    if workers < 1 or sites < 1:
        raise ValueError("need at least one worker and one site")
    names = [f"site-{i + 1}" for i in range(sites)]

    def links(site: str) -> list[tuple[str, float, float]]:
        return [(s, cross_mbps, cross_ms) for s in names if s != site]

    control = edge_node(
        "control", cores=8, memory_gib=16, site=names[0], role="control", links=links(names[0])
    )
    out = [control]
    width = len(str(workers))
    for i in range(workers):
        site = names[i % sites]
        kind = i % 6
        name = f"worker-{i + 1:0{width}d}"
        if kind == 0:
            out.append(edge_node(name, cores=24, memory_gib=32, site=site, links=links(site)))
        else:
            gpus = 2 if kind == 5 else 1
            out.append(edge_node(name, gpus=gpus, site=site, links=links(site)))
    return out
