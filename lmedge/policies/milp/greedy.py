"""The MILP baseline's plan when HiGHS finds no incumbent in its time limit.

On a large cluster (120 workers, thousands of binaries) the solver can stop
at `time_limit_s` without any feasible point. Keeping "whatever is running"
is then no plan at all on a cold cluster: nothing runs, so nothing is ever
served. Instead the slot gets a greedy plan built from the same profiled
inputs as the MILP (`lmedge.policies.kit.estimates`), and the decision says so.

The greedy, per slot:

1. keep every running instance whose mode the MILP may use (no churn, and a
   backlogged LM is never stranded); they hold their resources;
2. take the batches largest first; for each, the candidates are the active
   (node, mode) pairs of its LM and the inactive ones that still fit the
   node's budgets (cores, deployment memory, vGPUs, vRAM, one pod per LM and
   node; gpu = 1 vGPU, cpu = default cores, as in the MILP); the modeled
   delay of the batch is transfer + cold start (when inactive) +
   s_im (Q_ni + prompts already sent there this slot + k) — the MILP's
   D_bnm plus the congestion the batch itself adds;
3. the cheapest candidate wins (ties: already active, then node order) and
   is activated if it was not.

The batch loop is compiled (kernel.py): at 1,000 workers it prices ~350,000
(batch, node) pairs a slot. It is feasible by construction and serves every
LM that fits anywhere. It is not the MILP's optimum (no fairness term), and
is audited as what it is: the router's and the deployers' decisions carry
`source="fallback"` and the solver status in `error`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from lmedge.api import ClusterContext, LMPlacement, Mode, Placement, SlotObservation
from lmedge.api.base import built
from lmedge.api.constants import COLD_START_S
from lmedge.policies.kit.estimates import (
    NodeLinks,
    allowed_modes,
    memoized,
    service_s,
    transfer_bits,
)
from lmedge.policies.milp import kernel

_CODE: dict[str, int] = {"gpu": kernel.GPU, "cpu": kernel.CPU}
_MODE: dict[int, Mode] = {kernel.GPU: "gpu", kernel.CPU: "cpu"}


@dataclass(frozen=True)
class _Tables:
    """What the greedy reads of the context, as arrays (kept in its memo)."""

    workers: list[str]
    lms: list[str]
    lm_index: dict[str, int]
    links: NodeLinks
    node_of: Any  # per worker: its position in NodeLinks
    allowed: Any  # [worker, LM]: mode bits
    feasible_ptr: Any
    feasible_idx: Any
    need: Any  # [LM, 3]: default cores, deployment memory, min vRAM
    per_prompt: Any  # [LM, 2]
    capacity: Any  # [worker, 4]: cores, memory, vGPUs, vRAM

    @classmethod
    def of(cls, ctx: ClusterContext, cpu_modes: bool) -> _Tables:
        return memoized(ctx, f"milp.greedy_tables.{cpu_modes}", lambda: cls._build(ctx, cpu_modes))

    @classmethod
    def _build(cls, ctx: ClusterContext, cpu_modes: bool) -> _Tables:
        links = NodeLinks.of(ctx)
        workers = [n.name for n in ctx.workers]
        at = {n: k for k, n in enumerate(workers)}
        lms = list(ctx.lm_names)
        allowed_of = allowed_modes(ctx, cpu_modes)
        allowed = np.zeros((len(workers), len(lms)), dtype=np.int64)
        for w, n in enumerate(workers):
            for i, lm in enumerate(lms):
                for m in allowed_of[n, lm]:
                    allowed[w, i] |= _CODE[m]
        ptr, idx = [0], list[int]()
        for lm in lms:
            idx.extend(at[n] for n in ctx.feasible_nodes(lm))
            ptr.append(len(idx))
        specs = [ctx.service(lm).spec for lm in lms]
        nodes = [ctx.node(n).spec for n in workers]
        return cls(
            workers=workers,
            lms=lms,
            lm_index={lm: i for i, lm in enumerate(lms)},
            links=links,
            node_of=np.array([links.index[n] for n in workers], dtype=np.int64),
            allowed=allowed,
            feasible_ptr=np.array(ptr, dtype=np.int64),
            feasible_idx=np.array(idx, dtype=np.int64),
            need=np.array(
                [[s.default_cpu_cores, s.deployment_memory_gib, s.min_vram_gib] for s in specs],
                dtype=float,
            ).reshape(len(lms), 3),
            per_prompt=np.array(
                [[service_s(ctx, lm, "gpu"), service_s(ctx, lm, "cpu")] for lm in lms], dtype=float
            ).reshape(len(lms), 2),
            capacity=np.array(
                [[n.cpu_cores, n.memory_gib, n.total_vgpus, n.total_vram_gib] for n in nodes],
                dtype=float,
            ).reshape(len(workers), 4),
        )


def greedy_slot(
    obs: SlotObservation, cpu_modes: bool
) -> tuple[dict[tuple[str, str], str], dict[str, Placement]]:
    """(destination per (origin, LM), placement per worker): the plan of the module docstring."""
    ctx = obs.context
    t = _Tables.of(ctx, cpu_modes)
    states = {s.name: s for s in obs.snapshot.nodes}
    shape = (len(t.workers), len(t.lms))
    active = np.zeros(shape, dtype=np.int64)
    queued = np.zeros(shape)
    budget = t.capacity.copy()
    kept: dict[tuple[int, int], LMPlacement] = {}
    for w, n in enumerate(t.workers):
        st = states.get(n)
        if st is None:
            continue
        for lm, count in st.backlog.items():
            i = t.lm_index.get(lm)
            if i is not None:
                queued[w, i] = float(count)
        for inst in st.instances:
            i = t.lm_index.get(inst.lm)
            code = _CODE.get(inst.mode, 0)
            if i is None or not t.allowed[w, i] & code:
                continue
            values = {"lm": inst.lm, "mode": inst.mode, "cpu_cores": inst.cpu_cores}
            kept[w, i] = built(LMPlacement, {**values, "vgpus": inst.vgpus})
            active[w, i] = code
            s = ctx.service(inst.lm).spec
            budget[w, 0] -= inst.cpu_cores
            budget[w, 1] -= s.deployment_memory_gib
            budget[w, 2] -= inst.vgpus
            if inst.mode == "gpu":
                budget[w, 3] -= s.min_vram_gib
    batches = sorted(
        (
            (a.origin, a.lm, max(a.prompts, 1))
            for a in obs.arrivals
            if a.requests > 0 and ctx.has_service(a.lm) and ctx.feasible_nodes(a.lm)
        ),
        key=lambda b: (-b[2], b[0], b[1]),
    )
    links = t.links
    picks = kernel.greedy(
        np.array([links.index.get(o, -1) for o, _, _ in batches], dtype=np.int64),
        np.array([t.lm_index[lm] for _, lm, _ in batches], dtype=np.int64),
        np.array([k for _, _, k in batches], dtype=float),
        np.array([transfer_bits(ctx, lm, k) for _, lm, k in batches], dtype=float),
        t.feasible_ptr,
        t.feasible_idx,
        t.node_of,
        t.allowed,
        active,
        queued,
        budget,
        t.need,
        t.per_prompt,
        COLD_START_S,
        links.arrays,
    ).tolist()
    dest = {(o, lm): t.workers[w] for (o, lm, _), w in zip(batches, picks, strict=True) if w >= 0}
    off = [
        built(LMPlacement, {"lm": lm, "mode": "off", "cpu_cores": 0, "vgpus": 0}) for lm in t.lms
    ]
    new: dict[tuple[int, int], LMPlacement] = {}
    for w, i in zip(*np.nonzero(active), strict=True):
        key = (int(w), int(i))
        if key not in kept:
            mode = _MODE[int(active[key])]
            lm = t.lms[key[1]]
            values = {"lm": lm, "mode": mode, "cpu_cores": ctx.service(lm).spec.default_cpu_cores}
            new[key] = built(LMPlacement, {**values, "vgpus": 1 if mode == "gpu" else 0})
    placements = {
        n: built(
            Placement,
            {
                "node": n,
                "lms": [kept.get((w, i), new.get((w, i), off[i])) for i in range(len(t.lms))],
            },
        )
        for w, n in enumerate(t.workers)
    }
    return dest, placements
