"""The deployer's rule backend: role-first, backlog-ordered, churn-averse.

On one node, every slot:

1. While a pod on the node is still starting (the pending rule would void
   any resource-adding action), keep the running set unchanged.
2. Wanted LMs: those in the node's role and every LM with backlog (the
   loop's backlog includes the prompts routed here this slot), ordered by
   (has backlog, in role, already running, backlog x service time). Other
   running LMs are switched off to free resources. An LM with queued work
   is never switched off and is started when it is not running, even off
   its role: a queue at a node where its LM never runs again would only
   time out (a stranded request). It stays off only when it does not fit
   beside LMs with more claim (backlog first), and then is wanted again
   next slot.
3. A running LM keeps its mode, cores and vGPUs (a resize restarts the pod).
4. Each LM that is not running starts in its planned mode
   (capacity.planned_mode: GPU-only LMs and LM2-like text LMs on GPU, LM1-like
   text LMs on CPU): GPU pods first, on one vGPU and `GPU_POD_CORES` cores;
   then CPU pods, sharing the cores that remain equally. A GPU-planned text
   LM without a free vGPU runs on CPU instead; an LM that does not fit
   (cores, memory, vGPUs, vRAM) stays off.
5. On a single-GPU node, vGPUs still free go to the GPU LMs being started,
   most backlog first, up to their maxVgpus (a larger share of the GPU under
   contention); running instances are not resized.

The result is feasible by construction (it is checked again by the caller).
"""

from __future__ import annotations

from dataclasses import dataclass

from lmedge.agents.rules.capacity import GPU_POD_CORES, planned_mode
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
    mode_of = {lm: planned_mode(services[lm].spec, spec) for lm in starting}
    # GPU pods first, so the CPU-mode text LMs share whatever cores remain.
    # GPU-only LMs before GPU-planned text LMs, which run on CPU when no vGPU is left.
    starting.sort(key=lambda lm: (mode_of[lm] != "gpu", services[lm].spec.runs_on != "gpu-only"))
    for k, lm in enumerate(starting):
        s = services[lm].spec
        if s.deployment_memory_gib > free.mem + 1e-9:
            continue
        mode = mode_of[lm]
        if mode == "gpu" and (free.vgpus < 1 or s.min_vram_gib > free.vram + 1e-9):
            mode = "cpu" if s.runs_on == "cpu-or-gpu" else ""
        if mode == "gpu":
            cores = min(GPU_POD_CORES, free.cores)
            if cores <= 0:
                continue
            placed = LMPlacement(lm=lm, mode="gpu", cpu_cores=cores, vgpus=1)
        elif mode == "cpu":
            # GPU pods start first, so every text LM after this one also runs on CPU.
            cpu_waiting = 1 + sum(
                1 for x in starting[k + 1 :] if services[x].spec.runs_on == "cpu-or-gpu"
            )
            cores = float(int(free.cores / cpu_waiting))
            if cores < 1:
                continue
            placed = LMPlacement(lm=lm, mode="cpu", cpu_cores=cores, vgpus=0)
        else:
            continue
        chosen[lm] = placed
        _consume(free, placed, services[lm])
    fresh = sorted(
        (lm for lm in starting if lm in chosen and chosen[lm].mode == "gpu"),
        key=lambda lm: (-backlog[lm], lm),
    )
    # Extra vGPUs only help on a single GPU: on more, the slot lands on another GPU
    # and the model runs there in turn (model parallel), not faster.
    while free.vgpus > 0 and fresh and len(spec.gpus) == 1:
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
