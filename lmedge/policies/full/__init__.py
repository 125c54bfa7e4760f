"""Deployer `full`: activate as many LMs as the node's CPU and GPU allow, and keep them.

The paper's RF activation. LMs are considered GPU-only first (they have no
other place), then in manifest order. Each takes its default CPU cores and
one vGPU when a vGPU and enough vRAM remain, otherwise CPU mode when allowed,
otherwise off; memory (deployment memory) must fit too. Leftover vGPUs are
then handed out one at a time, round-robin in the same order, up to each
LM's `maxVgpus`; leftover cores go to the CPU-mode LMs in whole cores. The
placement depends on the node's spec only, so it is identical every slot:
no reconfiguration after the first activation.
"""

from __future__ import annotations

from lmedge.api import (
    Decision,
    LMPlacement,
    NodeInfo,
    NodeObservation,
    Placement,
    ServiceInfo,
    hosting,
)
from lmedge.policies.kit.support import off

__all__ = ["FullDeployer", "full_placement"]


def full_placement(node: NodeInfo, services: list[ServiceInfo]) -> Placement:
    spec = node.spec
    cores, mem = spec.cpu_cores, spec.memory_gib
    vgpus, vram = spec.total_vgpus, spec.total_vram_gib
    order = sorted(services, key=lambda s: s.spec.runs_on != "gpu-only")
    chosen: dict[str, LMPlacement] = {}
    for s in order:
        modes = hosting.modes(spec, s.spec)
        need = s.spec.default_cpu_cores
        if not modes or need > cores + 1e-9 or s.spec.deployment_memory_gib > mem + 1e-9:
            chosen[s.name] = off(s.name)
            continue
        if "gpu" in modes and vgpus >= 1 and s.spec.min_vram_gib <= vram + 1e-9:
            chosen[s.name] = LMPlacement(lm=s.name, mode="gpu", cpu_cores=need, vgpus=1)
            vgpus -= 1
            vram -= s.spec.min_vram_gib
        elif "cpu" in modes:
            chosen[s.name] = LMPlacement(lm=s.name, mode="cpu", cpu_cores=need, vgpus=0)
        else:
            chosen[s.name] = off(s.name)
            continue
        cores -= need
        mem -= s.spec.deployment_memory_gib
    gpu_lms = [s for s in order if chosen[s.name].mode == "gpu"]
    while vgpus > 0:
        grew = False
        for s in gpu_lms:
            p = chosen[s.name]
            if vgpus > 0 and p.vgpus < s.spec.max_vgpus:
                chosen[s.name] = p.model_copy(update={"vgpus": p.vgpus + 1})
                vgpus -= 1
                grew = True
        if not grew:
            break
    cpu_lms = [s for s in order if chosen[s.name].mode == "cpu"]
    if cpu_lms and cores >= 1:
        extra = int(cores) // len(cpu_lms)
        for s in cpu_lms:
            p = chosen[s.name]
            chosen[s.name] = p.model_copy(update={"cpu_cores": p.cpu_cores + extra})
    return Placement(node=node.name, lms=[chosen[s.name] for s in services])


class FullDeployer:
    name = "full"

    def __init__(self) -> None:
        # keyed by what the placement depends on: an LMService applied, edited
        # or deleted, or an edited node, on a live cluster gives a new placement
        self._cached: dict[str, tuple[str, Placement]] = {}

    def place(self, obs: NodeObservation) -> Decision[Placement]:
        key = obs.node.model_dump_json() + "".join(s.model_dump_json() for s in obs.services)
        hit = self._cached.get(obs.node.name)
        if hit is not None and hit[0] == key:
            value = hit[1]
        else:
            value = full_placement(obs.node, obs.services)
            self._cached[obs.node.name] = (key, value)
        return Decision[Placement](
            agent="deployer", policy=self.name, source="rule", value=value, node=obs.node.name
        )
