"""The rules a placement must meet on an emulated node, and where its vGPUs land.

What the real cluster refuses (a control node, a mode the LM or node cannot
run, a vGPU count out of range) and what does not fit in the node's free
cores, memory, vGPU slots and vRAM, each as a sentence for
`ActuationResult.errors` ('' = allowed). Pure: starting and stopping pods
(cold starts, a set handed back to its queue) is the engine's.
"""

from __future__ import annotations

from typing import Literal

from lmedge.api.decisions import LMPlacement
from lmedge.api.hosting import refusal
from lmedge.api.observations import ServiceInfo
from lmedge.api.resources import LMServiceSpec
from lmedge.sim.entities import Instance, NodeSim


def invalid(node: NodeSim, p: LMPlacement, service: ServiceInfo) -> str:
    """Why `p` can never run on `node`, whatever else runs there ('' if it can).

    What may run where is `lmedge.api.hosting`'s; room is `misfit`'s, against what runs.
    """
    if why := refusal(node.info, service, p.mode, room=False):
        return why
    svc = service.spec
    if p.cpu_cores <= 0:
        return f"{p.lm}: {p.mode} mode needs CPU cores"
    if p.mode == "gpu" and not 1 <= p.vgpus <= svc.max_vgpus:
        return f"{p.lm} needs 1..{svc.max_vgpus} vGPUs in gpu mode, not {p.vgpus}"
    if p.mode == "cpu" and p.vgpus:
        return f"{p.lm} in cpu mode must hold 0 vGPUs"
    return ""


def misfit(node: NodeSim, p: LMPlacement, svc: LMServiceSpec, releasing: Instance | None) -> str:
    """Why `p` does not fit in what `node` has free once `releasing` stops ('' if it fits)."""
    spec = node.spec
    cores = node.cores_used - (releasing.cores if releasing else 0.0)
    mem = node.memory_used - (releasing.memory if releasing else 0.0)
    slots = sum(node.slots_used) - (releasing.vgpus if releasing else 0)
    vram = node.vram_used - (releasing.vram if releasing else 0.0)
    need_vram = svc.min_vram_gib if p.mode == "gpu" else 0.0
    vg = p.vgpus if p.mode == "gpu" else 0
    if cores + p.cpu_cores > spec.cpu_cores + 1e-9:
        return f"{p.lm}: {p.cpu_cores:g} cores do not fit on {node.name}"
    if mem + svc.deployment_memory_gib > spec.memory_gib + 1e-9:
        return f"{p.lm}: {svc.deployment_memory_gib:g} GiB memory does not fit on {node.name}"
    if slots + vg > spec.total_vgpus:
        return f"{p.lm}: {vg} vGPUs do not fit on {node.name}"
    if vram + need_vram > spec.total_vram_gib + 1e-9:
        return f"{p.lm}: {need_vram:g} GiB vRAM does not fit on {node.name}"
    return ""


def bind(node: NodeSim, vgpus: int, how: Literal["spread", "pack"]) -> list[tuple[int, int]]:
    """The (GPU, slots) a new pod of `vgpus` slots takes: one slot at a time on the GPU
    with the most free slots (`spread`) or the fewest (`pack`), lower index on ties."""
    per = node.spec.vgpus_per_gpu
    taken: dict[int, int] = {}
    used = list(node.slots_used)
    for _ in range(vgpus):
        free = [(per - u, g) for g, u in enumerate(used) if u < per]
        if how == "spread":
            g = max(free, key=lambda fg: (fg[0], -fg[1]))[1]
        else:
            g = min(free, key=lambda fg: (fg[0], fg[1]))[1]
        used[g] += 1
        taken[g] = taken.get(g, 0) + 1
    return sorted(taken.items())


def pod_shape(p: LMPlacement) -> tuple[str, float, int]:
    """What a pod's requests are made of: a placement of another shape means a new pod."""
    return (p.mode, p.cpu_cores, p.vgpus if p.mode == "gpu" else 0)
