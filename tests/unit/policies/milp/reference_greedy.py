"""The greedy plan as it was in Python, before its batch loop was compiled: the oracle
`test_greedy_kernel.py` holds `greedy_slot` equal to."""

from __future__ import annotations

from dataclasses import dataclass

from lmedge.api import ClusterContext, LMPlacement, Mode, Placement, SlotObservation
from lmedge.api.constants import COLD_START_S
from lmedge.policies.kit.estimates import Transfers, allowed_modes, service_s


@dataclass
class _Budget:
    cores: float
    mem: float
    vgpus: int
    vram: float

    def fits(self, ctx: ClusterContext, lm: str, mode: Mode) -> bool:
        s = ctx.service(lm).spec
        gpu = mode == "gpu"
        return (
            s.default_cpu_cores <= self.cores + 1e-9
            and s.deployment_memory_gib <= self.mem + 1e-9
            and (not gpu or (self.vgpus >= 1 and s.min_vram_gib <= self.vram + 1e-9))
        )

    def take(self, ctx: ClusterContext, lm: str, p: LMPlacement) -> None:
        s = ctx.service(lm).spec
        self.cores -= p.cpu_cores
        self.mem -= s.deployment_memory_gib
        self.vgpus -= p.vgpus
        if p.mode == "gpu":
            self.vram -= s.min_vram_gib


def reference_greedy(
    obs: SlotObservation, cpu_modes: bool
) -> tuple[dict[tuple[str, str], str], dict[str, Placement]]:
    """(destination per (origin, LM), placement per worker): the plan of the module docstring."""
    ctx = obs.context
    states = {s.name: s for s in obs.snapshot.nodes}
    workers = [n.name for n in ctx.workers]
    order = {n: k for k, n in enumerate(workers)}

    allowed = allowed_modes(ctx, cpu_modes)
    per_prompt = {(lm, m): service_s(ctx, lm, m) for lm in ctx.lm_names for m in ("gpu", "cpu")}

    budget: dict[str, _Budget] = {}
    chosen: dict[str, dict[str, LMPlacement]] = {n: {} for n in workers}
    for n in workers:
        spec = ctx.node(n).spec
        b = _Budget(spec.cpu_cores, spec.memory_gib, spec.total_vgpus, spec.total_vram_gib)
        st = states.get(n)
        for inst in st.instances if st else []:
            if not ctx.has_service(inst.lm) or inst.mode not in allowed[n, inst.lm]:
                continue
            p = LMPlacement(lm=inst.lm, mode=inst.mode, cpu_cores=inst.cpu_cores, vgpus=inst.vgpus)
            chosen[n][inst.lm] = p
            b.take(ctx, inst.lm, p)
        budget[n] = b
    queued = {
        (n, lm): float(states[n].backlog.get(lm, 0)) if n in states else 0.0
        for n in workers
        for lm in ctx.lm_names
    }
    batches = sorted(
        (
            (a.origin, a.lm, max(a.prompts, 1))
            for a in obs.arrivals
            if a.requests > 0 and ctx.has_service(a.lm) and ctx.feasible_nodes(a.lm)
        ),
        key=lambda b: (-b[2], b[0], b[1]),
    )
    dest: dict[tuple[str, str], str] = {}
    for origin, lm, k in batches:
        best: tuple[tuple[float, int, int], str, Mode] | None = None
        transfer = Transfers(ctx, origin, lm, k)
        for n in ctx.feasible_nodes(lm):
            active = chosen[n].get(lm)
            for m in allowed[n, lm]:
                if active is not None and active.mode != m:
                    continue
                if active is None and not budget[n].fits(ctx, lm, m):
                    continue
                cold = 0.0 if active is not None else COLD_START_S
                d = transfer.to(n) + cold + per_prompt[lm, m] * (queued[(n, lm)] + k)
                key = (d, int(active is None), order[n])
                if best is None or key < best[0]:
                    best = (key, n, m)
        if best is None:
            continue  # fits nowhere next to what runs: the router's nearest-node fallback
        _, n, m = best
        if lm not in chosen[n]:
            cores = ctx.service(lm).spec.default_cpu_cores
            p = LMPlacement(lm=lm, mode=m, cpu_cores=cores, vgpus=1 if m == "gpu" else 0)
            chosen[n][lm] = p
            budget[n].take(ctx, lm, p)
        queued[(n, lm)] += k
        dest[(origin, lm)] = n
    off = {lm: LMPlacement(lm=lm, mode="off", cpu_cores=0, vgpus=0) for lm in ctx.lm_names}
    placements = {
        n: Placement(node=n, lms=[chosen[n].get(lm, off[lm]) for lm in ctx.lm_names])
        for n in workers
    }
    return dest, placements
