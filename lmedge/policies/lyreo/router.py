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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np
from pydantic import Field

from lmedge.api import (
    ClusterContext,
    Decision,
    NodeState,
    RequestRecord,
    Route,
    RoutingMap,
    SlotObservation,
)
from lmedge.policies.lyapunov.params import PluginParams, parse_params
from lmedge.policies.milp.estimates import COLD_START_S, LinkTable, service_s, serving_mode

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


def workload(ctx: ClusterContext, state: NodeState) -> float:
    """W_s: normalized memory-time of the node's queued prompts over one slot."""
    total = 0.0
    for lm, q in state.backlog.items():
        if q <= 0 or not ctx.has_service(lm):
            continue
        mode = serving_mode(ctx, state, lm)[0]
        if mode == "off":
            continue
        mem, cap = memory_per_prompt(ctx, state.name, lm)
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

    def update_queues(self, loads: Mapping[str, float]) -> dict[str, float]:
        """Z_s <- max(Z_s + Y_s - eps, 0) from the realized workloads; returns Y."""
        mean = sum(loads.values()) / max(len(loads), 1)
        dev = {s: abs(w - mean) for s, w in loads.items()}
        for s, y in dev.items():
            self.z[s] = max(self.z.get(s, 0.0) + y - self.p.epsilon, 0.0)
        return dev

    def _per_lm(
        self, lm: str, states: Mapping[str, NodeState]
    ) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        """(seconds per prompt, wait before a new prompt, workload per prompt) per feasible node."""
        ctx = self.context
        per, wait, work = [], [], []
        for k in self.feasible[lm]:
            node = self.workers[k]
            mode, running = serving_mode(ctx, states[node], lm)
            t = service_s(ctx, lm, mode)
            mem, cap = memory_per_prompt(ctx, node, lm)
            per.append(t)
            wait.append(states[node].backlog.get(lm, 0) * t + (0.0 if running else COLD_START_S))
            work.append(mem * t / (cap * ctx.slot_s))
        return np.array(per), np.array(wait), np.array(work)

    def route(self, obs: SlotObservation) -> Decision[RoutingMap]:
        ctx = self.context
        states = {s.name: s for s in obs.snapshot.nodes}
        for n in self.workers:
            states.setdefault(n, NodeState(name=n))
        loads_map = {n: workload(ctx, states[n]) for n in self.workers}
        self.update_queues(loads_map)
        loads = np.array([loads_map[n] for n in self.workers])
        z = np.array([self.z[n] for n in self.workers])
        n_nodes = len(self.workers)
        per_lm: dict[str, tuple[Any, Any, Any]] = {}
        batches = [
            (k, a)
            for k, a in enumerate(obs.arrivals)
            if a.requests > 0 and len(self.feasible.get(a.lm, ())) > 0
        ]
        batches.sort(key=lambda t: (-t[1].prompts, t[0]))
        chosen: dict[int, str] = {}
        for k, a in batches:
            if a.lm not in per_lm:
                per_lm[a.lm] = self._per_lm(a.lm, states)
            per, wait, work = per_lm[a.lm]
            idx = self.feasible[a.lm]
            prompts = max(a.prompts, 1)
            mean = loads.mean()
            sign = np.sign(loads - mean)
            # sum_s' Z_s' sign(W_s' - mean): how the mean shift moves everyone's deviation.
            pull = float(z @ sign)
            latency = (
                self.links.transfer(a.origin, a.lm, prompts, idx) + wait + per * (prompts + 1) / 2
            )
            delta = prompts * work
            w = loads[idx]
            own = np.abs(w + delta - mean - delta / n_nodes) - np.abs(w - mean)
            others = -(delta / n_nodes) * (pull - z[idx] * sign[idx])
            balance = z[idx] * own + others
            score = self.p.nu * prompts * latency / ctx.deadline_s(a.lm) + balance
            if self.learner is not None:
                cands = [
                    Candidate(self.workers[i], float(lt), float(b), float(sc))
                    for i, lt, b, sc in zip(idx, latency, balance, score, strict=True)
                ]
                score = score + np.asarray(self.learner.bias(obs, self.z, k, cands), dtype=float)
            j = int(np.argmin(score))
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
