"""LYREO's Lyapunov load-balanced router (seed `lyreo.txt`, §IV-A), learner-ready.

Workload. Node s's normalized KV-cache memory-time consumption in a slot is

    W_s = sum_i Q_si * m_i * t_i / (M_s * slot_s)

prompts in its queues (Q_si) times the working memory each holds (m_i: the
LM's minimum vRAM on a GPU node, its minimum memory on a CPU node) times how
long it holds it (t_i, the profiled service time in the serving mode), over
the node's memory-time capacity (M_s: total vRAM, or memory on a CPU node,
times the slot length). Our LMs are not token-level decoders, so the
per-token KV cache of the seed becomes per-prompt working memory: the same
"memory x residency time" idea at the granularity the emulator models.

Load balance. Y_s = |W_s - mean W| is the deviation; a virtual queue per node

    Z_s(t+1) = max(Z_s(t) + Y_s(t) - eps, 0)

accumulates sustained imbalance. Each slot the router minimizes the
drift-plus-penalty bound

    nu * sum_b k_b * latency_b(s) / tau  +  sum_s Z_s * Y_s(after assignment)

greedily, batches largest first, each to the feasible node with the lowest
marginal value; the change of sum Z*Y is computed to first order (the batch
moves its node's W by delta, and the mean by delta/S), which keeps a slot at
O(batches x nodes). latency_b(s) = transfer + the node's backlog wait
(including batches assigned earlier this slot, and a cold start when the LM is
not running) + the batch's own mean service.

Learning seam. LYREO's PPO policy with reward redistribution is a
`LyreoLearner`: it may add a bias to each candidate's score, sees every
(slot, batch, candidates, choice) transition, and receives the delayed request
outcomes through `observe`. Without a learner (the registered `lyreo`) no
candidate objects are built at all and this is the pure Lyapunov scheduler
(the seed's "Ly" part without PPO); `NoLearner` is the explicit no-op.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np
from pydantic import Field

from lmedge.api import (
    ClusterContext,
    Decision,
    Mode,
    NodeState,
    RequestRecord,
    Route,
    RoutingMap,
    SlotObservation,
)
from lmedge.api.base import built
from lmedge.api.constants import COLD_START_S
from lmedge.policies.kit.estimates import (
    KIB_BITS,
    LinkTable,
    service_s,
    serving_mode,
)
from lmedge.policies.kit.params import PluginParams, parse_params

NAME = "lyreo"


class LyreoParams(PluginParams):
    nu: float = Field(default=0.5, ge=0, description="Weight of latency against load balance.")
    epsilon: float = Field(default=0.01, ge=0, description="Tolerated workload deviation.")


@dataclass(frozen=True)
class Candidate:
    """One feasible destination of one batch, with the terms of its score."""

    node: str
    latency_s: float
    balance: float
    score: float


@runtime_checkable
class LyreoLearner(Protocol):
    """The seam for LYREO's PPO learner with reward redistribution.

    `bias` returns an additive adjustment per candidate node (lower is
    better, like the score); `record` receives every decision as a transition
    of the sequence-MDP (state = the slot observation and the virtual queues);
    `observe` receives finished requests, whose latencies are the delayed
    rewards a return predictor redistributes to earlier decisions.
    """

    def bias(
        self, obs: SlotObservation, z: Mapping[str, float], b: int, cands: Sequence[Candidate]
    ) -> Sequence[float]: ...

    def record(
        self,
        obs: SlotObservation,
        z: Mapping[str, float],
        b: int,
        cands: Sequence[Candidate],
        chosen: str,
    ) -> None: ...

    def observe(self, records: Sequence[RequestRecord]) -> None: ...


class NoLearner:
    """No learned component: LYREO's Lyapunov scheduler alone."""

    def bias(
        self, obs: SlotObservation, z: Mapping[str, float], b: int, cands: Sequence[Candidate]
    ) -> Sequence[float]:
        return [0.0] * len(cands)

    def record(
        self,
        obs: SlotObservation,
        z: Mapping[str, float],
        b: int,
        cands: Sequence[Candidate],
        chosen: str,
    ) -> None:
        return None

    def observe(self, records: Sequence[RequestRecord]) -> None:
        return None


def memory_per_prompt(ctx: ClusterContext, node: str, lm: str) -> tuple[float, float]:
    """(GiB one prompt of `lm` holds while served on `node`, node memory capacity GiB)."""
    spec, s = ctx.node(node).spec, ctx.service(lm).spec
    if spec.has_gpu:
        return max(s.min_vram_gib, 1e-3), spec.total_vram_gib
    return s.min_memory_gib, spec.memory_gib


def workload(
    ctx: ClusterContext,
    state: NodeState,
    mode_of: Callable[[NodeState, str], tuple[Mode, bool]] | None = None,
    memory_of: Callable[[str, str], tuple[float, float]] | None = None,
) -> float:
    """W_s: normalized memory-time of the node's queued prompts over one slot.

    `mode_of(state, lm)` and `memory_of(node, lm)` default to `serving_mode`
    and `memory_per_prompt`; the router passes its cached versions.
    """
    mode_of = mode_of or (lambda st, lm: serving_mode(ctx, st, lm))
    memory_of = memory_of or (lambda node, lm: memory_per_prompt(ctx, node, lm))
    total = 0.0
    for lm, q in state.backlog.items():
        if q <= 0 or not ctx.has_service(lm):
            continue
        mode = mode_of(state, lm)[0]
        if mode == "off":
            continue
        mem, cap = memory_of(state.name, lm)
        total += q * mem * service_s(ctx, lm, mode) / (cap * ctx.loop.slot_s)
    return total


class LyreoRouter:
    """The `lyreo` router plugin; stateful through the virtual queues Z.

    The greedy itself is compiled (`kernel`), so a slot on 1,000 workers x
    10,000 requests stays in tenths of a second. Ties go to the earlier worker
    in manifest order; a candidate whose score is not finite (no mode can serve
    the LM there) is chosen only when no candidate's is.
    """

    name = NAME

    def __init__(
        self, context: ClusterContext, params: LyreoParams, learner: LyreoLearner | None
    ) -> None:
        # Compiling (or loading the compiled kernel from numba's cache) costs a
        # second or so: only when LYREO is used, not whenever the catalog loads.
        from lmedge.policies.lyreo import kernel

        self._kernel = kernel
        self.context = context
        self.p = params
        self.learner = learner
        self.workers = [n.name for n in context.workers]
        self.z: dict[str, float] = dict.fromkeys(self.workers, 0.0)
        self.links = LinkTable(context)
        self.lm_names = [lm for lm in context.lm_names if context.feasible_nodes(lm)]
        self._lm_id = {lm: k for k, lm in enumerate(self.lm_names)}
        # What the context alone decides, kept across slots: each LM's candidates,
        # flat and LM by LM; their position by node; and, in the node's fastest
        # mode, seconds a prompt and workload a prompt.
        index = self.links.index
        flat = [
            (lm, j, node)
            for lm in self.lm_names
            for j, node in enumerate(context.feasible_nodes(lm))
        ]
        self._cand = np.array([index[node] for _, _, node in flat], dtype=np.int64)
        sizes = [len(context.feasible_nodes(lm)) for lm in self.lm_names]
        self._lm_off = np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)
        self._width = max(sizes, default=0)
        self._position = {  # node -> flat candidate index, per LM
            lm: {n: int(self._lm_off[k]) + j for j, n in enumerate(context.feasible_nodes(lm))}
            for k, lm in enumerate(self.lm_names)
        }
        self._node_position: dict[str, dict[str, int]] = {n: {} for n in self.workers}
        for lm, at in self._position.items():
            for n, c in at.items():
                self._node_position[n][lm] = c
        self._deadline = np.array([context.deadline_s(lm) for lm in self.lm_names])
        self._mem: dict[tuple[str, str], tuple[float, float]] = {}
        self._modes: dict[tuple[str, str], Mode] = {}
        self._terms: dict[tuple[str, str, Mode], tuple[float, float, float, float]] = {}
        self._entries: dict[tuple[str, str, Mode | None], tuple[int, float, float, float]] = {}
        self._batch_keys: dict[tuple[str, str], int] = {}
        self._key_rows: list[tuple[int, int, int, float]] = []
        self._key_table: np.ndarray[Any, Any] | None = None
        fastest = [self._serving(n, lm, self._fastest(n, lm)) for lm, _, n in flat]
        self._per = np.array([t for t, _, _, _ in fastest])
        self._work = np.array([w for _, _, _, w in fastest])
        # Transfer rows, one per (origin site, intra-site link, LM), aligned with the LM's
        # candidates; origins of one site see the same row but for their own node.
        self._row_id: dict[tuple[Any, ...], int] = {}
        self._row_parts: list[tuple[Any, Any]] = []
        self._rows_flat: tuple[Any, Any, Any] | None = None

    def update_queues(self, loads: Mapping[str, float]) -> dict[str, float]:
        """Z_s <- max(Z_s + Y_s - eps, 0) from the realized workloads; returns Y."""
        mean = sum(loads.values()) / max(len(loads), 1)
        dev = {s: abs(w - mean) for s, w in loads.items()}
        for s, y in dev.items():
            self.z[s] = max(self.z.get(s, 0.0) + y - self.p.epsilon, 0.0)
        return dev

    def _memory_time(self, node: str, lm: str) -> tuple[float, float]:
        """(memory per prompt, capacity) on `node`: the context's alone, so kept."""
        key = (node, lm)
        got = self._mem.get(key)
        if got is None:
            got = self._mem[key] = memory_per_prompt(self.context, node, lm)
        return got

    def _fastest(self, node: str, lm: str) -> Mode:
        """The mode a deployer would start `lm` in on `node` (the context's alone, so kept)."""
        key = (node, lm)
        mode = self._modes.get(key)
        if mode is None:
            modes = self.context.modes(node, lm)
            mode = self._modes[key] = modes[0] if modes else "off"
        return mode

    def _row(self, origin: str, lm: str) -> tuple[int, int]:
        """(transfer row id, the origin's position among `lm`'s candidates or -1)."""
        ctx, lo = self.context, int(self._lm_off[self._lm_id[lm]])
        flat = self._position[lm].get(origin)
        own = -1 if flat is None else flat - lo
        spec = ctx.node(origin).spec
        key = (spec.site, spec.intra_site_latency_ms, spec.intra_site_bandwidth_mbps, lm)
        rid = self._row_id.get(key)
        if rid is None:
            lat, bw = self.links.row(origin)
            idx = self._cand[self._lm_off[self._lm_id[lm]] : self._lm_off[self._lm_id[lm] + 1]]
            lat2, bwi = 2 * lat[idx], bw[idx].copy()
            if own >= 0:  # another origin of the site: the intra-site link
                lat2[own] = 2 * (spec.intra_site_latency_ms / 1000.0)
                bwi[own] = spec.intra_site_bandwidth_mbps * 1e6
            rid = self._row_id[key] = len(self._row_parts)
            self._row_parts.append((lat2, bwi))
            self._rows_flat = None
        return rid, own

    def _serving(self, node: str, lm: str, mode: Mode) -> tuple[float, float, float, float]:
        """(seconds a prompt, memory a prompt, memory-time capacity, workload a prompt)."""
        key = (node, lm, mode)
        got = self._terms.get(key)
        if got is None:
            t = service_s(self.context, lm, mode)
            mem, cap = self._memory_time(node, lm)
            capacity = cap * self.context.loop.slot_s
            got = self._terms[key] = (t, mem, capacity, mem * t / capacity)
        return got

    def _entry(self, node: str, lm: str, mode: Mode | None) -> tuple[int, float, float, float]:
        """(flat candidate index or -1, seconds a prompt, memory a prompt, memory-time capacity)
        of `lm` queued on `node`, served by its running instance in `mode`, or by a new one
        in the node's fastest mode when `mode` is None. Seconds are 0 when the queue adds
        no workload (an LM the context does not know, or no mode to serve it in).
        """
        key = (node, lm, mode)
        got = self._entries.get(key)
        if got is None:
            c = self._node_position[node].get(lm, -1)
            if not self.context.has_service(lm):
                got = (c, 0.0, 0.0, 1.0)
            else:
                serving: Mode = mode if mode is not None else self._fastest(node, lm)
                if serving == "off":
                    got = (c, 0.0, 0.0, 1.0)
                else:
                    t, mem, capacity, _ = self._serving(node, lm, serving)
                    got = (c, t, mem, capacity)
            self._entries[key] = got
        return got

    def _slot_arrays(self, states: Mapping[str, NodeState]) -> Any:
        """The slot's `SlotArrays`, the workloads W and the queues Z updated, in one pass."""
        entries, entry = self._entries, self._entry
        per, work = self._per.copy(), self._work.copy()
        wait = np.full(per.shape, COLD_START_S)
        queued_at: list[int] = []
        queued: list[int] = []
        loads_map: dict[str, float] = {}
        for node in self.workers:
            state, at = states[node], self._node_position[node]
            running: dict[str, Mode] = {}
            for inst in state.instances:
                running.setdefault(inst.lm, inst.mode)
            for lm, mode in running.items():
                c = at.get(lm)
                if c is not None:
                    per[c], _, _, work[c] = self._serving(node, lm, mode)
                    wait[c] = 0.0
            total = 0.0  # `workload`, term for term
            for lm, q in state.backlog.items():
                if q == 0:
                    continue
                now = running.get(lm)
                c, t, mem, capacity = entries.get((node, lm, now)) or entry(node, lm, now)
                if c >= 0:
                    queued_at.append(c)
                    queued.append(q)
                if q > 0 and t:
                    total += q * mem * t / capacity
            loads_map[node] = total
        self.update_queues(loads_map)
        loads = np.array([loads_map[n] for n in self.workers])
        z = np.array([self.z[n] for n in self.workers])
        with np.errstate(invalid="ignore"):  # 0 * inf where no mode serves the LM: not finite
            wait += per * 0.0
            wait[queued_at] += np.array(queued, dtype=float) * per[queued_at]
        if self._rows_flat is None:
            lat2 = [r[0] for r in self._row_parts]
            bw = [r[1] for r in self._row_parts]
            off = np.concatenate(([0], np.cumsum([len(r) for r in lat2]))).astype(np.int64)
            self._rows_flat = (np.concatenate(lat2), np.concatenate(bw), off)
        return self._kernel.SlotArrays(
            loads=loads,
            z=z,
            total=np.array([math.fsum(loads)]),
            cand=self._cand,
            cand_per=per,
            cand_wait=wait,
            cand_work=work,
            cand_z=z[self._cand],
            lm_off=self._lm_off,
            lm_deadline=self._deadline,
            row_lat2=self._rows_flat[0],
            row_bw=self._rows_flat[1],
            row_off=self._rows_flat[2],
        )

    def _batch_key(self, origin: str, lm: str) -> int:
        """Row of (origin, lm) in the key table: LM id, transfer row, the origin's
        position among the LM's candidates or -1, and KiB a prompt moves."""
        key = (origin, lm)
        got = self._batch_keys.get(key)
        if got is None:
            if self.context.has_node(origin):
                rid, own = self._row(origin, lm)
                profile = self.context.service(lm).spec.profile
                kib = profile.request_kib + profile.response_kib
            else:  # an origin outside the cluster: no transfer is modelled
                rid, own, kib = self._row_to_nowhere(lm), -1, 0.0
            got = self._batch_keys[key] = len(self._key_rows)
            self._key_rows.append((self._lm_id[lm], rid, own, kib))
            self._key_table = None
        return got

    def route(self, obs: SlotObservation) -> Decision[RoutingMap]:
        states = {s.name: s for s in obs.snapshot.nodes}
        for n in self.workers:
            states.setdefault(n, NodeState(name=n))
        arrivals, lm_id, keys = obs.arrivals, self._lm_id, self._batch_keys
        ks, ids, sizes = [], [], []
        for k, a in enumerate(arrivals):
            if a.requests > 0 and a.lm in lm_id:
                i = keys.get((a.origin, a.lm))
                ks.append(k)
                ids.append(self._batch_key(a.origin, a.lm) if i is None else i)
                sizes.append(a.prompts)
        if self._key_table is None:
            self._key_table = np.array(self._key_rows, dtype=float).reshape(-1, 4)
        prompts = np.maximum(np.array(sizes, dtype=np.int64), 1)
        # largest batches first, ties in arrival order
        by = np.lexsort((np.arange(len(ks)), -prompts))
        order = [ks[i] for i in by.tolist()]
        keyed, prompts = self._key_table[np.array(ids, dtype=np.int64)[by]], prompts[by]
        batches = self._kernel.Batches(
            lm=keyed[:, 0].astype(np.int64),
            row=keyed[:, 1].astype(np.int64),
            own=keyed[:, 2].astype(np.int64),
            prompts=prompts,
            bits=prompts * keyed[:, 3] * KIB_BITS,
        )
        arrays = self._slot_arrays(states)
        if self.learner is None:
            dest = np.empty(len(order), dtype=np.int64)
            self._kernel.route_all(arrays, batches, self.p.nu, max(self._width, 1), dest)
            chosen = dict(zip(order, dest.tolist(), strict=True))
        else:
            chosen = self._route_learned(obs, order, arrays, batches)
        names = self.workers
        # trusted names (the context's and the arrivals'): no revalidation
        routes = [
            built(
                Route,
                {
                    "origin": arrivals[k].origin,
                    "lm": arrivals[k].lm,
                    "destination": names[chosen[k]],
                    "model": None,
                },
            )
            for k in sorted(chosen)
        ]
        return Decision[RoutingMap](
            agent="scheduler", policy=NAME, source="rule", value=RoutingMap(routes=routes)
        )

    def _row_to_nowhere(self, lm: str) -> int:
        """A zero transfer row for `lm` (an origin the context does not know)."""
        key = ("", lm)
        rid = self._row_id.get(key)
        if rid is None:
            size = int(self._lm_off[self._lm_id[lm] + 1] - self._lm_off[self._lm_id[lm]])
            rid = self._row_id[key] = len(self._row_parts)
            self._row_parts.append((np.zeros(size), np.full(size, np.inf)))
            self._rows_flat = None
        return rid

    def _route_learned(
        self, obs: SlotObservation, order: list[int], arrays: Any, batches: Any
    ) -> dict[int, int]:
        """The same greedy, batch by batch, with the learner's bias on each score."""
        assert self.learner is not None
        kernel, width = self._kernel, max(self._width, 1)
        latency, balance, score = np.empty(width), np.empty(width), np.empty(width)
        chosen: dict[int, int] = {}
        for b, k in enumerate(order):
            m = kernel.batch_scores(b, arrays, batches, self.p.nu, latency, balance, score)
            lo = int(self._lm_off[batches.lm[b]])
            nodes = [self.workers[i] for i in self._cand[lo : lo + m]]
            cands = [
                Candidate(node, float(lt), float(bl), float(sc))
                for node, lt, bl, sc in zip(nodes, latency[:m], balance[:m], score[:m], strict=True)
            ]
            biased = score[:m] + np.asarray(self.learner.bias(obs, self.z, k, cands), dtype=float)
            j = int(kernel.first_min(biased, m))
            self.learner.record(obs, self.z, k, cands, nodes[j])
            chosen[k] = kernel.commit(b, j, arrays, batches)
        return chosen

    def observe(self, records: Sequence[RequestRecord]) -> None:
        if self.learner is not None:
            self.learner.observe(records)


def build(
    context: ClusterContext,
    seed: int,
    params: Mapping[str, Any],
    learner: LyreoLearner | None = None,
) -> LyreoRouter:
    """Factory; `learner` is the seam for a trained PPO policy (default: none)."""
    del seed
    return LyreoRouter(context, parse_params(LyreoParams, params, NAME), learner)
