"""The deployer's rule backend: role-first, backlog-ordered, churn-averse.

On one node, every slot:

1. While a pod on the node is still starting (the pending rule would void
   any resource-adding action), keep the running set unchanged.
2. Wanted LMs: those in the node's role and those with local backlog (an
   off-role request already here still deserves service), ordered by
   (has backlog, in role, already running, backlog x service time).
   Running LMs that are neither in the role nor have backlog are switched
   off to free resources.
3. A running LM keeps its mode, cores and vGPUs (a resize restarts the pod).
4. Each LM that is not running starts, in that order, with what remains:
   GPU-only LMs on one vGPU; text LMs on a vGPU when one is left after the
   GPU-only LMs still waiting, else on CPU with the default cores (more on a
   CPU-only node: the free cores split over the CPU LMs still waiting).
   An LM that does not fit (cores, memory, vGPUs, vRAM) stays off.
5. vGPUs still free go to the GPU LMs being started, most backlog first, up
   to their maxVgpus; running instances are not resized.

The result is feasible by construction (it is checked again by the caller).
"""

from __future__ import annotations

from dataclasses import dataclass

from lmedge.api import LMPlacement, NodeObservation, Placement, ServiceInfo


@dataclass
class _Free:
    cores: float
    mem: float
    vgpus: int
    vram: float


def _off(lm: str) -> LMPlacement:
    return LMPlacement(lm=lm, mode="off", cpu_cores=0, vgpus=0)


def _work(s: ServiceInfo, backlog: int) -> float:
    return backlog * s.spec.profile.gpu_seconds_per_prompt


def rule_placement(obs: NodeObservation) -> Placement:
    """The rule's placement for the node in `obs` (see the module docstring)."""
    node, spec, state = obs.node, obs.node.spec, obs.state
    services = {s.name: s for s in obs.services}
    running = {i.lm: i for i in state.instances if i.lm in services}
    if spec.role != "worker":
        return Placement(node=node.name, lms=[_off(s.name) for s in obs.services])
    if state.pending:
        kept = {
            lm: LMPlacement(lm=lm, mode=i.mode, cpu_cores=i.cpu_cores, vgpus=i.vgpus)
            for lm, i in running.items()
        }
        return Placement(node=node.name, lms=[kept.get(s.name, _off(s.name)) for s in obs.services])
    backlog = {lm: state.backlog.get(lm, 0) for lm in services}
    roles = set(obs.roles)
    wanted = [lm for lm in services if lm in roles or backlog[lm] > 0]
    wanted.sort(
        key=lambda lm: (
            backlog[lm] > 0,
            lm in roles,
            lm in running,
            _work(services[lm], backlog[lm]),
        ),
        reverse=True,
    )
    free = _Free(spec.cpu_cores, spec.memory_gib, spec.total_vgpus, spec.total_vram_gib)
    chosen: dict[str, LMPlacement] = {}
    for lm in wanted:
        inst = running.get(lm)
        if inst is None:
            continue
        s = services[lm].spec
        need_vram = s.min_vram_gib if inst.mode == "gpu" else 0.0
        if (
            inst.cpu_cores <= free.cores + 1e-9
            and s.deployment_memory_gib <= free.mem + 1e-9
            and inst.vgpus <= free.vgpus
            and need_vram <= free.vram + 1e-9
        ):
            chosen[lm] = LMPlacement(
                lm=lm, mode=inst.mode, cpu_cores=inst.cpu_cores, vgpus=inst.vgpus
            )
            _consume(free, chosen[lm], services[lm])
    starting = [lm for lm in wanted if lm not in chosen]
    for k, lm in enumerate(starting):
        s = services[lm].spec
        later_gpu_only = sum(1 for x in starting[k + 1 :] if services[x].spec.runs_on == "gpu-only")
        gpu_ok = spec.has_gpu and s.min_vram_gib <= free.vram + 1e-9 and free.vgpus >= 1
        cores = min(s.default_cpu_cores, free.cores)
        if cores <= 0 or s.deployment_memory_gib > free.mem + 1e-9:
            continue
        if s.runs_on == "gpu-only" or (gpu_ok and free.vgpus - 1 >= later_gpu_only):
            if not gpu_ok:
                continue
            placed = LMPlacement(lm=lm, mode="gpu", cpu_cores=cores, vgpus=1)
        else:
            if not spec.has_gpu:
                cpu_waiting = sum(
                    1 for x in starting[k:] if services[x].spec.runs_on == "cpu-or-gpu"
                )
                cores = max(cores, free.cores / max(1, cpu_waiting))
                cores = float(int(cores)) if cores >= 1 else cores
            placed = LMPlacement(lm=lm, mode="cpu", cpu_cores=cores, vgpus=0)
        chosen[lm] = placed
        _consume(free, placed, services[lm])
    fresh = sorted(
        (lm for lm in starting if lm in chosen and chosen[lm].mode == "gpu"),
        key=lambda lm: (-backlog[lm], lm),
    )
    while free.vgpus > 0 and fresh:
        grew = False
        for lm in fresh:
            p = chosen[lm]
            if free.vgpus > 0 and p.vgpus < services[lm].spec.max_vgpus:
                chosen[lm] = p.model_copy(update={"vgpus": p.vgpus + 1})
                free.vgpus -= 1
                grew = True
        if not grew:
            break
    return Placement(node=node.name, lms=[chosen.get(s.name, _off(s.name)) for s in obs.services])


def _consume(free: _Free, p: LMPlacement, s: ServiceInfo) -> None:
    free.cores -= p.cpu_cores
    free.mem -= s.spec.deployment_memory_gib
    free.vgpus -= p.vgpus
    if p.mode == "gpu":
        free.vram -= s.spec.min_vram_gib
