"""Deployer `random`: a random activation within the node's budgets, every slot.

LMs are visited in a random order; each gets a random mode among off and the
modes the hardware allows. An active LM takes its default CPU cores (fewer if
fewer remain) and, on GPU, between 1 and `maxVgpus` vGPUs from what remains;
an LM that no longer fits (cores, memory, vGPUs, vRAM) is switched off. The
result is feasible by construction. Because it is redrawn each slot it churns
instances, which is what the paper's RR baseline measures.
"""

from __future__ import annotations

import random

from lmedge.api import Decision, LMPlacement, Mode, NodeObservation, Placement, hosting
from lmedge.policies.kit.support import off


class RandomDeployer:
    name = "random"

    def __init__(self, seed: int = 0) -> None:
        self._rng = random.Random(seed)

    def place(self, obs: NodeObservation) -> Decision[Placement]:
        spec = obs.node.spec
        cores, mem = spec.cpu_cores, spec.memory_gib
        vgpus, vram = spec.total_vgpus, spec.total_vram_gib
        chosen: dict[str, LMPlacement] = {}
        order = list(obs.services)
        self._rng.shuffle(order)
        for s in order:
            modes: list[Mode] = ["off", *hosting.modes(spec, s.spec)]
            mode = self._rng.choice(modes)
            need_cores = min(s.spec.default_cpu_cores, cores)
            fits = need_cores > 0 and s.spec.deployment_memory_gib <= mem + 1e-9
            if mode == "gpu":
                fits = fits and vgpus >= 1 and s.spec.min_vram_gib <= vram + 1e-9
            if mode == "off" or not fits:
                chosen[s.name] = off(s.name)
                continue
            g = self._rng.randint(1, min(s.spec.max_vgpus, vgpus)) if mode == "gpu" else 0
            chosen[s.name] = LMPlacement(lm=s.name, mode=mode, cpu_cores=need_cores, vgpus=g)
            cores -= need_cores
            mem -= s.spec.deployment_memory_gib
            vgpus -= g
            if mode == "gpu":
                vram -= s.spec.min_vram_gib
        value = Placement(node=obs.node.name, lms=[chosen[s.name] for s in obs.services])
        return Decision[Placement](
            agent="deployer", policy=self.name, source="rule", value=value, node=obs.node.name
        )
