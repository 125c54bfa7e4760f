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
outcomes through `observe`. The default `NoLearner` adds nothing, which makes
this the pure Lyapunov scheduler (the seed's "Ly" baselines without PPO).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

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
from lmedge.policies.milp.estimates import COLD_START_S, service_s, serving_mode, transfer_s

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
    """The `lyreo` router plugin; stateful through the virtual queues Z."""

    name = NAME

    def __init__(self, context: ClusterContext, params: LyreoParams, learner: LyreoLearner) -> None:
        self.context = context
        self.p = params
        self.learner = learner
        self.z: dict[str, float] = {n.name: 0.0 for n in context.workers}

    def update_queues(self, loads: Mapping[str, float]) -> dict[str, float]:
        """Z_s <- max(Z_s + Y_s - eps, 0) from the realized workloads; returns Y."""
        mean = sum(loads.values()) / max(len(loads), 1)
        dev = {s: abs(w - mean) for s, w in loads.items()}
        for s, y in dev.items():
            self.z[s] = max(self.z.get(s, 0.0) + y - self.p.epsilon, 0.0)
        return dev

    def route(self, obs: SlotObservation) -> Decision[RoutingMap]:
        ctx = self.context
        states = {s.name: s for s in obs.snapshot.nodes}
        workers = [n.name for n in ctx.workers]
        empty = {n: NodeState(name=n) for n in workers if n not in states}
        states.update(empty)
        loads = {n: workload(ctx, states[n]) for n in workers}
        self.update_queues(loads)
        extra_wait: dict[tuple[str, str], float] = {}
        batches = [
            (k, a)
            for k, a in enumerate(obs.arrivals)
            if a.requests > 0 and ctx.feasible_nodes(a.lm)
        ]
        batches.sort(key=lambda t: (-t[1].prompts, t[0]))
        chosen: dict[int, str] = {}
        n_nodes = len(workers)
        for k, a in batches:
            prompts = max(a.prompts, 1)
            mean = sum(loads.values()) / n_nodes
            # sum_{s'} Z_s' sign(W_s' - mean): how the mean shift moves everyone else's deviation.
            pull = sum(self.z[s] * _sign(loads[s] - mean) for s in workers)
            cands: list[Candidate] = []
            for s in ctx.feasible_nodes(a.lm):
                mode, running = serving_mode(ctx, states[s], a.lm)
                per = service_s(ctx, a.lm, mode)
                wait = states[s].backlog.get(a.lm, 0) * per + extra_wait.get((s, a.lm), 0.0)
                wait += 0.0 if running else COLD_START_S
                lat = transfer_s(ctx, a.origin, s, a.lm, prompts) + wait + per * (prompts + 1) / 2
                mem, cap = memory_per_prompt(ctx, s, a.lm)
                delta = prompts * mem * per / (cap * ctx.slot_s)
                own = abs(loads[s] + delta - mean - delta / n_nodes) - abs(loads[s] - mean)
                others = -(delta / n_nodes) * (pull - self.z[s] * _sign(loads[s] - mean))
                balance = self.z[s] * own + others
                score = self.p.nu * prompts * lat / ctx.deadline_s(a.lm) + balance
                cands.append(Candidate(s, lat, balance, score))
            bias = self.learner.bias(obs, self.z, k, cands)
            best = min(range(len(cands)), key=lambda j: (cands[j].score + bias[j], cands[j].node))
            node = cands[best].node
            self.learner.record(obs, self.z, k, cands, node)
            chosen[k] = node
            mode = serving_mode(ctx, states[node], a.lm)[0]
            per = service_s(ctx, a.lm, mode)
            mem, cap = memory_per_prompt(ctx, node, a.lm)
            loads[node] += prompts * mem * per / (cap * ctx.slot_s)
            extra_wait[(node, a.lm)] = extra_wait.get((node, a.lm), 0.0) + prompts * per
        routes = [
            Route(origin=obs.arrivals[k].origin, lm=obs.arrivals[k].lm, destination=chosen[k])
            for k in sorted(chosen)
        ]
        return Decision[RoutingMap](
            agent="scheduler", policy=NAME, source="rule", value=RoutingMap(routes=routes)
        )

    def observe(self, records: Sequence[RequestRecord]) -> None:
        self.learner.observe(records)


def _sign(x: float) -> float:
    return 1.0 if x > 0 else -1.0 if x < 0 else 0.0


def build(
    context: ClusterContext,
    seed: int,
    params: Mapping[str, Any],
    learner: LyreoLearner | None = None,
) -> LyreoRouter:
    """Factory; `learner` is the seam for a trained PPO policy (default: none)."""
    del seed
    return LyreoRouter(context, parse_params(LyreoParams, params, NAME), learner or NoLearner())
