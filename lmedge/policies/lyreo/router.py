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
from lmedge.policies.lyapunov.params import PluginParams, parse_params
from lmedge.policies.milp.estimates import (
    COLD_START_S,
    KIB_BITS,
    LinkTable,
    modes_on,
    service_s,
    serving_mode,
)

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
        total += q * mem * service_s(ctx, lm, mode) / (cap * ctx.slot_s)
    return total


class LyreoRouter:
    """The `lyreo` router plugin; stateful through the virtual queues Z.

    Vectorized over nodes with numpy, so a slot on 1,000 workers x 10,000
    requests stays in seconds. Ties go to the earlier worker in manifest order.
    """

    name = NAME

    def __init__(
        self, context: ClusterContext, params: LyreoParams, learner: LyreoLearner | None
    ) -> None:
        self.context = context
        self.p = params
        self.learner = learner
        self.workers = [n.name for n in context.workers]
        self.z: dict[str, float] = dict.fromkeys(self.workers, 0.0)
        self.links = LinkTable(context)
        self.feasible = {
            lm: np.array([self.links.index[n] for n in context.feasible_nodes(lm)], dtype=int)
            for lm in context.lm_names
        }
        # What the context alone decides, kept across slots (at 1,000 workers the
        # per-node lookups were a quarter of a slot): each node's position among an
        # LM's candidates, memory per prompt, fastest mode, and transfer rows.
        self._position = {
            lm: {n: j for j, n in enumerate(context.feasible_nodes(lm))} for lm in context.lm_names
        }
        self._mem: dict[tuple[str, str], tuple[float, float]] = {}
        self._fastest: dict[tuple[str, str], Mode] = {}
        self._rows: dict[tuple[Any, ...], tuple[Any, Any]] = {}

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

    def _mode(self, state: NodeState, lm: str) -> tuple[Mode, bool]:
        """`serving_mode`, with the node's fastest mode (the context's alone) kept."""
        inst = state.instance(lm)
        if inst is not None:
            return inst.mode, True
        key = (state.name, lm)
        mode = self._fastest.get(key)
        if mode is None:
            modes = modes_on(self.context, state.name, lm)
            mode = self._fastest[key] = modes[0] if modes else "off"
        return mode, False

    def _per_lm(
        self, lm: str, states: Mapping[str, NodeState]
    ) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        """(seconds per prompt, wait before a new prompt, workload per prompt) per feasible node."""
        ctx = self.context
        per, wait, work = [], [], []
        for k in self.feasible[lm]:
            node = self.workers[k]
            mode, running = self._mode(states[node], lm)
            t = service_s(ctx, lm, mode)
            mem, cap = self._memory_time(node, lm)
            per.append(t)
            wait.append(states[node].backlog.get(lm, 0) * t + (0.0 if running else COLD_START_S))
            work.append(mem * t / (cap * ctx.slot_s))
        return np.array(per), np.array(wait), np.array(work)

    def _transfer(self, origin: str, lm: str, prompts: int) -> np.ndarray[Any, Any]:
        """`LinkTable.transfer` to `lm`'s feasible nodes, its rows kept per origin site.

        Origins of one site with the same intra-site link see the same row but
        for their own node (no transfer), which is set after: the values are
        those of `LinkTable.transfer`, computed the same way.
        """
        ctx = self.context
        if not ctx.has_node(origin):
            return np.zeros(len(self.feasible[lm]))
        own = self._position[lm].get(origin)
        spec = ctx.node(origin).spec
        key = (spec.site, spec.intra_site_latency_ms, spec.intra_site_bandwidth_mbps, lm)
        row = self._rows.get(key)
        if row is None:
            lat, bw = self.links.row(origin)
            idx = self.feasible[lm]
            lat2, bwi = 2 * lat[idx], bw[idx].copy()
            if own is not None:  # another origin of the site: the intra-site link
                lat2[own] = 2 * (spec.intra_site_latency_ms / 1000.0)
                bwi[own] = spec.intra_site_bandwidth_mbps * 1e6
            row = self._rows[key] = (lat2, bwi)
        lat2, bwi = row
        profile = ctx.service(lm).spec.profile
        bits = prompts * (profile.request_kib + profile.response_kib) * KIB_BITS
        out: np.ndarray[Any, Any] = lat2 + bits / bwi
        if own is not None:
            out[own] = 0.0  # 2 * 0 + bits / inf, as the origin's own row has it
        return out

    def route(self, obs: SlotObservation) -> Decision[RoutingMap]:
        ctx = self.context
        states = {s.name: s for s in obs.snapshot.nodes}
        for n in self.workers:
            states.setdefault(n, NodeState(name=n))
        loads_map = {
            n: workload(ctx, states[n], self._mode, self._memory_time) for n in self.workers
        }
        self.update_queues(loads_map)
        loads = np.array([loads_map[n] for n in self.workers])
        z = np.array([self.z[n] for n in self.workers])
        n_nodes = len(self.workers)
        # per LM, once a slot: its columns, Z at its candidates, deadline
        per_lm: dict[str, tuple[Any, Any, Any, Any, float]] = {}
        # per (LM, prompts): the batch's workload delta, delta / S and its mean service
        per_size: dict[tuple[str, int], tuple[Any, Any, Any]] = {}
        batches = [
            (k, a)
            for k, a in enumerate(obs.arrivals)
            if a.requests > 0 and len(self.feasible.get(a.lm, ())) > 0
        ]
        batches.sort(key=lambda t: (-t[1].prompts, t[0]))
        chosen: dict[int, str] = {}
        add_reduce, sign_of, absolute = np.add.reduce, np.sign, np.abs
        for k, a in batches:
            lm = a.lm
            cols = per_lm.get(lm)
            if cols is None:
                per, wait, work = self._per_lm(lm, states)
                cols = per_lm[lm] = (per, wait, work, z[self.feasible[lm]], ctx.deadline_s(lm))
            per, wait, work, zi, deadline = cols
            idx = self.feasible[lm]
            prompts = max(a.prompts, 1)
            sized = per_size.get((lm, prompts))
            if sized is None:
                delta = prompts * work
                sized = per_size[(lm, prompts)] = (
                    delta, delta / n_nodes, per * (prompts + 1) / 2
                )  # fmt: skip
            delta, shift, mean_service = sized
            mean = add_reduce(loads) / n_nodes  # = loads.mean(), without its Python wrapper
            sign = sign_of(loads - mean)
            # sum_s' Z_s' sign(W_s' - mean): how the mean shift moves everyone's deviation.
            pull = float(z @ sign)
            latency = self._transfer(a.origin, lm, prompts) + wait + mean_service
            w = loads[idx]
            own = absolute(w + delta - mean - shift) - absolute(w - mean)
            others = -shift * (pull - zi * sign[idx])
            balance = zi * own + others
            score = self.p.nu * prompts * latency / deadline + balance
            if self.learner is not None:
                cands = [
                    Candidate(self.workers[i], float(lt), float(b), float(sc))
                    for i, lt, b, sc in zip(idx, latency, balance, score, strict=True)
                ]
                score = score + np.asarray(self.learner.bias(obs, self.z, k, cands), dtype=float)
            j = int(score.argmin())
            node = self.workers[idx[j]]
            if self.learner is not None:
                self.learner.record(obs, self.z, k, cands, node)
            chosen[k] = node
            loads[idx[j]] += delta[j]
            wait[j] += prompts * per[j]
        routes = [
            Route(origin=obs.arrivals[k].origin, lm=obs.arrivals[k].lm, destination=chosen[k])
            for k in sorted(chosen)
        ]
        return Decision[RoutingMap](
            agent="scheduler", policy=NAME, source="rule", value=RoutingMap(routes=routes)
        )

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
