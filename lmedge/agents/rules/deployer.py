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
3. A running LM keeps its mode, cores and vGPUs (a resize restarts the
   pod), unless a wanted LM would not fit otherwise: then GPU-only pods
   shrink to one vGPU and text LMs are re-fitted like new pods (GPU-only
   LMs take the vGPUs first, a text LM may move to the cores), when that
   places more of the LMs with queued work (in priority order). With
   `follow_modes`, also when it places as many of those and more of the
   idle role LMs the plan sized a unit for (a pod in a mode the plan did
   not size, e.g. a text LM on the vGPU the plan gave a GPU-only LM, would
   otherwise keep that LM off the whole epoch: the router sends work only
   at a cold start's extra cost where an LM does not run). And when every
   wanted LM runs but a text LM with queued work sits on cores where a vGPU
   serves it faster while another pod holds the vGPUs (it started there when
   none was free, or before its queue grew; step 5 only uses vGPUs that are
   free): the same re-fit, kept when the scoring guard's estimate of the
   node's queues (scoring.placement_objective: every restarted pod pays a
   cold start, a pod on cores serves at its Amdahl rate) is lower than
   keeping the pods by `REFIT_MARGIN`. This is the Lyapunov deployer's idea
   (score the placements, take the best) applied only where the rule's own
   order cannot move a pod, so the rule's guarantees (every queue served,
   no vGPU idle) stay as they are. A pod that started recently (`young`:
   the deployer's `PodAges`) is not moved by this re-fit until it has paid
   back its cold start (`REFIT_HOLD_S`): the one-slot estimate flips as the
   queues move, and would otherwise swap two pods back and forth.
4. Each LM that is not running starts in its planned mode:
   capacity.planned_mode (GPU where the node has one, except a text LM
   whose CPU time is within `CPU_PREFERENCE` of its GPU time), or, with
   `follow_modes`, the macro policy's (`obs.modes`, the mode the planner
   sized its routing weight for) when that mode is open on the node. GPU
   pods first, on one vGPU and `GPU_POD_CORES` cores (fewer, down to
   `GPU_POD_MIN_CORES`, shared equally when the node has fewer cores than
   that for every GPU pod that can start: a vGPU left idle for want of a
   host core holds capacity back); then CPU pods, sharing the cores that
   remain equally. A planned mode is a preference,
   not a constraint: a GPU-planned text LM without a free vGPU runs on CPU
   instead; a CPU-planned text LM that is faster on a vGPU takes one that
   no GPU-planned LM took (it would idle), or one when no whole core is
   left; an LM that does not fit (cores, memory, vGPUs, vRAM) stays off.
   `follow_modes` is off by default: measured on twelve generated
   scenarios and the testbed it wins on some and loses on others (the
   planner sizes modes for throughput, and a text LM it puts on cores
   serves each request many times slower; README "Planned modes").
5. A running pod moves to a better shape when capacity has freed: a text
   LM on cores whose planned mode is GPU takes a free vGPU, a GPU pod on a
   single-GPU node beside busy GPU pods takes free vGPUs up to its maxVgpus
   (its time slice grows only under contention), when the estimated
   gain on its queue outweighs the restart: backlog / rate_now >
   COLD_START_S + backlog / rate_new (capacity.py's rates), largest gain
   first. Without this an LM started on cores while every vGPU was taken
   (an LMService applied mid-run) stays there after a vGPU frees.
6. On a single-GPU node, vGPUs still free go to the GPU LMs being started,
   most backlog first, up to their maxVgpus (a larger share of the GPU under
   contention).

The result is feasible by construction; the controller's decision guard checks it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache

from lmedge.agents.rules.capacity import GPU_POD_CORES, cpu_rate, gpu_rate, planned_mode
from lmedge.agents.scoring import placement_objective
from lmedge.api import (
    EdgeNodeSpec,
    InstanceState,
    LMPlacement,
    NodeObservation,
    Placement,
    ServiceInfo,
    hosting,
)
from lmedge.api.base import built
from lmedge.api.constants import COLD_START_S
from lmedge.metrics import LAMBDA

#: A re-fit that only moves pods (nothing more starts) must be estimated better
#: than keeping them by this much J: restarts cost more than the one-slot
#: estimate sees (a pod's queue waits, and its traffic keeps coming).
REFIT_MARGIN = 0.005
#: Fewest cores a GPU pod is started with when the node's cores run short: its
#: host side (tokenizer, launch) uses about one core (the emulator's
#: `gpuHostCores`); below `GPU_POD_CORES` it is no slower (the GPU serves).
GPU_POD_MIN_CORES = 1.0
#: A pod the deployer saw (re)start is not moved by step 3's scored re-fit
#: until it has paid back its cold start: up that long and then serving as
#: long (a pod first seen at slot t started after slot t-1's observation, so
#: its age counts from t, a lower bound). The re-fit's estimate sees one slot
#: and flips as the queues drain and grow; without a hold two pods swapped at
#: one slot swap back at the next, two restarts each for nothing (dev gen-104
#: seed 1 with the s18 planner: J 0.052 -> 0.046). Ten cold starts instead
#: held good swaps back too (held-out gen-1019: J 0.010 -> 0.018).
REFIT_HOLD_S = 2 * COLD_START_S


@dataclass
class _Free:
    cores: float
    mem: float
    vgpus: int
    vram: float


@lru_cache(maxsize=4096)
def _lmp(lm: str, mode: str, cores: float, vgpus: int) -> LMPlacement:
    # 16 per node a slot, 16,000 at 1,000 nodes: built from values this module
    # made, without pydantic's validation (the guard checks the placement), and
    # shared (LMPlacement is frozen), so a slot's placements are mostly old
    # objects that the collector does not walk again.
    return built(LMPlacement, {"lm": lm, "mode": mode, "cpu_cores": float(cores), "vgpus": vgpus})


def _off(lm: str) -> LMPlacement:
    return _lmp(lm, "off", 0.0, 0)


def _placement(node: str, lms: list[LMPlacement]) -> Placement:
    return built(Placement, {"node": node, "lms": lms})


class PodAges:
    """Per node, the slot each running pod was first seen in its present shape
    (mode, cores, vGPUs): the deployer's memory for step 3's hold.

    The deployer keeps one across slots: the controller loop holds one
    deployer for the run, and on a cluster each node agent holds its own for
    its node, so both worlds see the same ages. It reads only the observed
    instances, so a pod restarted by anyone (the guard's repair, a node that
    came back) counts as well. Pods on a node's first observation are of
    unknown age and count as old (after a restart of the agent at most one
    re-fit comes early). Each node's entry is replaced whole by that node's
    own call, so the loop may call several nodes at once.
    """

    def __init__(self) -> None:
        self._seen: dict[str, dict[str, tuple[tuple[str, float, int], int | None]]] = {}

    def young(self, obs: NodeObservation, hold_s: float = REFIT_HOLD_S) -> frozenset[str]:
        """Record `obs` and return the LMs whose pods started less than `hold_s` ago."""
        before = self._seen.get(obs.node.name)
        now: dict[str, tuple[tuple[str, float, int], int | None]] = {}
        for i in obs.state.instances:
            shape = (i.mode, i.cpu_cores, i.vgpus)
            old = before.get(i.lm) if before is not None else None
            if before is None:
                since: int | None = None
            elif old is not None and old[0] == shape and (old[1] is None or old[1] <= obs.slot):
                since = old[1]
            else:  # new, or restarted in another shape, since the last observation
                since = obs.slot
            now[i.lm] = (shape, since)
        self._seen[obs.node.name] = now
        return frozenset(
            lm
            for lm, (_, since) in now.items()
            if since is not None and (obs.slot - since) * obs.slot_s < hold_s
        )


def gpu_pod_cores(free_cores: float, pods: int) -> float:
    """Cores for each of `pods` GPU pods starting on a node with `free_cores`:
    `GPU_POD_CORES`, or fewer, shared equally, when that many are not free
    (whole millicores), but at least `GPU_POD_MIN_CORES` while that many are.
    Also how the LLM deployer's compact reply is sized (rendering.parse_placement)."""
    share = free_cores / max(pods, 1)
    cores = max(min(GPU_POD_CORES, share), min(GPU_POD_MIN_CORES, free_cores))
    return float(int(cores * 1000)) / 1000


def _work(s: ServiceInfo, backlog: int) -> float:
    return backlog * s.spec.profile.gpu_seconds_per_prompt


def rule_placement(
    obs: NodeObservation,
    *,
    follow_modes: bool = False,
    lam: float = LAMBDA,
    young: frozenset[str] = frozenset(),
) -> Placement:
    """The rule's placement for the node in `obs` (see the module docstring).

    `follow_modes`: start LMs in the plan's modes (`obs.modes`, step 4) and
    re-fit for an idle role LM the plan sized (step 2); off, the plan's modes
    are not read (the default: measured, it does not help overall, README).
    `lam`: the run's objective weight, for the estimate that decides a re-fit (step 3).
    `young`: LMs whose pods started too recently to be moved by step 3's scored
    re-fit (`PodAges.young`); the re-fit for an LM that does not fit ignores it.
    """
    planned = obs.modes if follow_modes else {}
    node, spec, state = obs.node, obs.node.spec, obs.state
    services = {s.name: s for s in obs.services}
    running = {i.lm: i for i in state.instances if i.lm in services}
    if spec.role != "worker":
        return _placement(node.name, [_off(s.name) for s in obs.services])
    if state.pending:
        kept = {lm: _lmp(lm, i.mode, i.cpu_cores, i.vgpus) for lm, i in running.items()}
        return _placement(node.name, [kept.get(s.name) or _off(s.name) for s in obs.services])
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
    chosen = _fit(obs, planned, wanted, running, backlog, shrink=False)
    queued = [lm for lm in wanted if backlog[lm] > 0]
    sized = [lm for lm in wanted if lm in planned and backlog[lm] == 0]
    if any(lm not in chosen for lm in queued + sized):
        # Something wanted does not fit beside the running pods as they are: shrink
        # them (GPU-only pods to one vGPU; text LMs re-fitted like new pods in their
        # planned mode, so a GPU-only LM takes a vGPU first and a text LM may move
        # to the cores) and keep that plan if it serves more of the LMs with queued
        # work, or as many and more of the idle role LMs the plan sized a unit for
        # here. An idle role LM without a planned mode is not worth a resize; one
        # with it is: the routing weights count on its unit, and a pod kept in a
        # mode the plan did not size (a text LM on the vGPU the plan gave a
        # GPU-only LM) would keep it off for the whole epoch. A resize restarts a
        # pod (one cold start; its queue waits on the node), which beats an LM
        # that could never start while a neighbour holds extra vGPUs or cores.
        shrunk = _fit(obs, planned, wanted, running, backlog, shrink=True)
        if _claim(shrunk, queued, sized) > _claim(chosen, queued, sized):
            chosen = shrunk
    elif _slowed(obs, chosen, running, backlog):
        # Everything wanted runs, but a text LM with queued work is on cores while
        # its vGPU-faster mode is held by a pod that needs it less (it started
        # there when no vGPU was free, or before its queue grew). The re-fit gives
        # the vGPUs out again in priority order (queued work first); it runs when
        # the estimate of the node's queues (scoring.placement_objective: each
        # restarted pod pays a cold start) says it beats keeping the pods as they are.
        shrunk = _fit(obs, planned, wanted, running, backlog, shrink=True)
        if (
            not any(shrunk.get(lm) != chosen.get(lm) for lm in young)
            and _claim(shrunk, queued, sized) >= _claim(chosen, queued, sized)
            and (
                placement_objective(obs, _placement(node.name, list(shrunk.values())), lam)
                < placement_objective(obs, _placement(node.name, list(chosen.values())), lam)
                - REFIT_MARGIN
            )
        ):
            chosen = shrunk
    return _placement(node.name, [chosen.get(s.name) or _off(s.name) for s in obs.services])


def _claim(
    chosen: dict[str, LMPlacement], queued: list[str], sized: list[str]
) -> tuple[tuple[int, ...], int]:
    """What a fit serves: which of `queued` (in priority order, compared
    lexicographically), then how many of the idle planned `sized` LMs."""
    return tuple(int(lm in chosen) for lm in queued), sum(lm in chosen for lm in sized)


def _slowed(
    obs: NodeObservation,
    chosen: dict[str, LMPlacement],
    running: dict[str, InstanceState],
    backlog: dict[str, int],
) -> bool:
    """Whether a running text LM with queued work is kept on cores where a vGPU
    serves it faster, beside a pod of another LM on a vGPU (step 3's re-fit)."""
    spec = obs.node.spec
    if spec.total_vgpus == 0:
        return False
    services = {s.name: s.spec for s in obs.services}
    on_gpu = [lm for lm, p in chosen.items() if p.mode == "gpu"]
    return any(
        p.mode == "cpu"
        and lm in running
        and backlog[lm] > 0
        and planned_mode(services[lm], spec) == "gpu"
        and any(x != lm for x in on_gpu)
        for lm, p in chosen.items()
    )


def _fit(
    obs: NodeObservation,
    planned: Mapping[str, str],
    wanted: list[str],
    running: dict[str, InstanceState],
    backlog: dict[str, int],
    *,
    shrink: bool,
) -> dict[str, LMPlacement]:
    """Fit `wanted` (priority order) on the node: running pods first, then starts.

    Without `shrink` a running pod keeps its shape; with it a GPU-only pod
    keeps one vGPU and a text LM's pod is re-fitted like a new one.
    """
    spec = obs.node.spec
    services = {s.name: s for s in obs.services}
    free = _Free(spec.cpu_cores, spec.memory_gib, spec.total_vgpus, spec.total_vram_gib)
    chosen: dict[str, LMPlacement] = {}
    for lm in wanted:
        inst = running.get(lm)
        s = services[lm].spec
        if inst is None or (shrink and s.runs_on == "cpu-or-gpu"):
            continue
        vgpus = min(inst.vgpus, 1) if shrink and inst.mode == "gpu" else inst.vgpus
        need_vram = s.min_vram_gib if inst.mode == "gpu" else 0.0
        if (
            inst.cpu_cores <= free.cores + 1e-9
            and s.deployment_memory_gib <= free.mem + 1e-9
            and vgpus <= free.vgpus
            and need_vram <= free.vram + 1e-9
        ):
            chosen[lm] = _lmp(lm, inst.mode, inst.cpu_cores, vgpus)
            _consume(free, chosen[lm], services[lm])
    starting = [lm for lm in wanted if lm not in chosen]
    mode_of = {lm: _preferred_mode(spec, services[lm], planned) for lm in starting}
    # GPU pods first, so the CPU-mode text LMs share whatever cores remain.
    # GPU-only LMs before GPU-planned text LMs, which run on CPU when no vGPU is left.
    starting.sort(key=lambda lm: (mode_of[lm] != "gpu", services[lm].spec.runs_on != "gpu-only"))
    for k, lm in enumerate(starting):
        s = services[lm].spec
        if s.deployment_memory_gib > free.mem + 1e-9:
            continue
        mode = mode_of[lm]
        gpu_free = (
            free.vgpus >= 1
            and s.min_vram_gib <= free.vram + 1e-9
            and "gpu" in hosting.modes(spec, s)
        )
        if mode == "gpu" and not gpu_free:
            mode = "cpu" if "cpu" in hosting.modes(spec, s) else ""
        elif mode == "cpu" and gpu_free and planned_mode(s, spec) == "gpu":
            # The plan's cores for a text LM faster on a vGPU only put it after the
            # GPU-planned LMs: a vGPU none of them took would idle this slot.
            mode = "gpu"
        cores = 0.0
        if mode == "cpu":
            # GPU pods start first, so every text LM after this one also runs on CPU.
            cpu_waiting = 1 + sum(
                1 for x in starting[k + 1 :] if services[x].spec.runs_on == "cpu-or-gpu"
            )
            cores = float(int(free.cores / cpu_waiting))
            if cores < 1:
                # Not a whole core left: a free vGPU rather than off.
                mode = "gpu" if gpu_free else ""
        if mode == "gpu":
            # GPU pods share the cores when there are fewer than GPU_POD_CORES for
            # each one that can still start: a vGPU left idle for lack of a host
            # core would hold capacity back (and strand the LM's queue).
            gpu_waiting = min(
                free.vgpus,
                1 + sum(1 for x in starting[k + 1 :] if mode_of[x] == "gpu"),
            )
            cores = gpu_pod_cores(free.cores, gpu_waiting)
            if cores <= 0 or cores < s.min_cpu_cores:
                continue
            placed = _lmp(lm, "gpu", cores, 1)
        elif mode == "cpu":
            placed = _lmp(lm, "cpu", cores, 0)
        else:
            continue
        chosen[lm] = placed
        _consume(free, placed, services[lm])
    _upgrade(obs, chosen, [lm for lm in wanted if lm not in starting], backlog, free)
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
                chosen[lm] = _lmp(lm, p.mode, p.cpu_cores, p.vgpus + 1)
                free.vgpus -= 1
                grew = True
        if not grew:
            break
    return chosen


def _preferred_mode(node: EdgeNodeSpec, svc: ServiceInfo, planned: Mapping[str, str]) -> str:
    """The mode to start `svc` in first: the plan's (`planned`) when open on the node,
    else `capacity.planned_mode`; "" when it cannot run here."""
    mode = planned.get(svc.name)
    if mode is not None and mode in hosting.modes(node, svc.spec):
        return mode
    return planned_mode(svc.spec, node)


def _upgrade(
    obs: NodeObservation,
    chosen: dict[str, LMPlacement],
    kept: list[str],
    backlog: dict[str, int],
    free: _Free,
) -> None:
    """Move kept pods to a faster shape on free capacity when it pays (step 5).

    The gain of a move is the time its queue saves, backlog / rate_now -
    backlog / rate_new, against one cold start (the restart); an idle LM is
    not moved (nothing to gain until work arrives, when it is asked again).
    """
    spec = obs.node.spec
    services = {s.name: s.spec for s in obs.services}
    while free.vgpus > 0:
        best: tuple[float, str, LMPlacement] | None = None
        for lm in kept:
            p, s, b = chosen.get(lm), services[lm], backlog[lm]
            if p is None or b <= 0:
                continue
            if p.mode == "cpu":
                if planned_mode(s, spec) != "gpu" or s.min_vram_gib > free.vram + 1e-9:
                    continue
                cores = min(GPU_POD_CORES, free.cores + p.cpu_cores)
                new = _lmp(lm, "gpu", cores, 1)
                now, then = cpu_rate(s, p.cpu_cores), gpu_rate(s, spec, 1)
            elif p.mode == "gpu" and len(spec.gpus) == 1 and p.vgpus < s.max_vgpus:
                # A larger slice is faster only beside busy pods (time-slicing by busy
                # slots): alone on the GPU a pod already has all of it.
                busy = sum(
                    q.vgpus for x, q in chosen.items() if x != lm and q.mode == "gpu" and backlog[x]
                )
                if not busy:
                    continue
                new = _lmp(lm, "gpu", p.cpu_cores, min(s.max_vgpus, p.vgpus + free.vgpus))
                now = p.vgpus / (p.vgpus + busy) / s.profile.gpu_seconds_per_prompt
                then = new.vgpus / (new.vgpus + busy) / s.profile.gpu_seconds_per_prompt
            else:
                continue
            if now <= 0 or then <= now or new.cpu_cores <= 0:
                continue
            gain = b / now - b / then - COLD_START_S
            if gain > 0 and (best is None or gain > best[0]):
                best = (gain, lm, new)
        if best is None:
            return
        _, lm, new = best
        old = chosen[lm]
        free.cores += old.cpu_cores - new.cpu_cores
        free.vgpus -= new.vgpus - old.vgpus
        if old.mode == "cpu":
            free.vram -= services[lm].min_vram_gib
        chosen[lm] = new


def _consume(free: _Free, p: LMPlacement, s: ServiceInfo) -> None:
    free.cores -= p.cpu_cores
    free.mem -= s.spec.deployment_memory_gib
    free.vgpus -= p.vgpus
    if p.mode == "gpu":
        free.vram -= s.spec.min_vram_gib
