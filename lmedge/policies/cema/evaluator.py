"""CEMA's BatchEvaluator: the normalized four-term cost of a whole-batch assignment.

Genes are the slot's nonempty (origin, request class) batches (the routing map
is per (origin, class) pair, so requests of one batch cannot be split); alleles
are the batch's legal destinations (node, model): every node that can host
every LM serving the class (`ClusterContext.models_for`; an LM name is served
by itself). For an assignment g:

    J(g) = wQ Q(g)/Q_ub + wC C(g)/C_ub + wE E(g)/E_ub + wT T(g)/T_ub

- Q: prompt-weighted mean quality loss 1 - q_hat(class, node, model), so a
  better model (its `quality` prior, then its observed success) lowers Q;
- C: monetary cost, busy seconds x the node's `power.costPerHour` / 3600;
- E: energy, busy seconds x busy power of the serving mode (per vGPU, or per
  core on CPU) + transfer seconds x `radio_watts`;
- T: batch completion time (makespan): max over genes of transfer + the
  destination's finish time, where a destination (node, LM) finishes after
  its backlog B_d (queued prompts x service time, + cold start when the LM is
  not running) and every batch assigned to it in this assignment.

Each `*_ub` is an upper bound of its term over all legal assignments (the
per-gene worst choice), so every normalized term lies in [0, 1].
"""

from __future__ import annotations

from dataclasses import dataclass

from lmedge.api import ClusterContext, PowerProfile, SlotObservation
from lmedge.policies.cema.quality import QualityPredictor
from lmedge.policies.milp.estimates import backlog_s, service_s, serving_mode, transfer_s


@dataclass(frozen=True)
class Weights:
    quality: float
    cost: float
    energy: float
    time: float


@dataclass(frozen=True)
class Gene:
    origin: str
    lm: str
    prompts: int


class BatchEvaluator:
    """Precomputes per (gene, destination) terms once per slot; scores assignments fast."""

    def __init__(
        self,
        obs: SlotObservation,
        predictor: QualityPredictor,
        weights: Weights,
        radio_watts: float,
    ) -> None:
        ctx = obs.context
        states = {s.name: s for s in obs.snapshot.nodes}
        self.weights = weights
        self.genes = [
            Gene(a.origin, a.lm, max(a.prompts, 1))
            for a in obs.arrivals
            if a.requests > 0 and any(ctx.feasible_nodes(m) for m in ctx.models_for(a.lm))
        ]
        self.dests: list[tuple[str, str]] = []  # (node, serving model)
        index: dict[tuple[str, str], int] = {}
        self.legal: list[list[int]] = []
        self.service: list[dict[int, float]] = []
        self.transfer: list[dict[int, float]] = []
        self.loss: list[dict[int, float]] = []
        self.cost: list[dict[int, float]] = []
        self.energy: list[dict[int, float]] = []
        for g in self.genes:
            legal: list[int] = []
            svc, net, loss, cost, energy = {}, {}, {}, {}, {}
            for model, n in _alleles(ctx, g.lm):
                key = (n, model)
                if key not in index:
                    index[key] = len(self.dests)
                    self.dests.append(key)
                d = index[key]
                legal.append(d)
                state = states.get(n)
                mode = serving_mode(ctx, state, model)[0] if state else "gpu"
                spec = ctx.node(n).spec
                power = spec.power or PowerProfile()
                busy = g.prompts * service_s(ctx, model, mode)
                watts = (
                    power.busy_watts_per_gpu
                    if mode == "gpu"
                    else power.busy_watts_per_core * ctx.service(model).spec.default_cpu_cores
                )
                svc[d] = busy
                net[d] = transfer_s(ctx, g.origin, n, model, g.prompts)
                loss[d] = 1.0 - predictor.predict(g.lm, n, model)
                cost[d] = busy * power.cost_per_hour / 3600.0
                energy[d] = busy * watts + net[d] * radio_watts
            self.legal.append(legal)
            self.service.append(svc)
            self.transfer.append(net)
            self.loss.append(loss)
            self.cost.append(cost)
            self.energy.append(energy)
        self.backlog = [
            backlog_s(ctx, states[n], lm) if n in states else 0.0 for n, lm in self.dests
        ]
        prompts = sum(g.prompts for g in self.genes) or 1
        self.weight = [g.prompts / prompts for g in self.genes]
        self.q_ub = sum(w * max(t.values()) for w, t in zip(self.weight, self.loss, strict=True))
        self.c_ub = sum(max(t.values()) for t in self.cost)
        self.e_ub = sum(max(t.values()) for t in self.energy)
        self.t_ub = (
            max(self.backlog, default=0.0)
            + sum(max(t.values()) for t in self.service)
            + max((max(t.values()) for t in self.transfer), default=0.0)
        )

    def finish_times(self, chromosome: list[int]) -> list[float]:
        finish = list(self.backlog)
        for g, d in enumerate(chromosome):
            finish[d] += self.service[g][d]
        return finish

    def completion(self, chromosome: list[int]) -> list[float]:
        """Per-gene completion time: transfer + its destination's finish time."""
        finish = self.finish_times(chromosome)
        return [self.transfer[g][d] + finish[d] for g, d in enumerate(chromosome)]

    def raw(self, chromosome: list[int]) -> tuple[float, float, float, float]:
        q = sum(self.weight[g] * self.loss[g][d] for g, d in enumerate(chromosome))
        c = sum(self.cost[g][d] for g, d in enumerate(chromosome))
        e = sum(self.energy[g][d] for g, d in enumerate(chromosome))
        t = max(self.completion(chromosome), default=0.0)
        return q, c, e, t

    def fitness(self, chromosome: list[int]) -> float:
        """J(g), lower is better."""
        q, c, e, t = self.raw(chromosome)
        w = self.weights
        return (
            w.quality * _norm(q, self.q_ub)
            + w.cost * _norm(c, self.c_ub)
            + w.energy * _norm(e, self.e_ub)
            + w.time * _norm(t, self.t_ub)
        )


def _alleles(ctx: ClusterContext, request_class: str) -> list[tuple[str, str]]:
    """(model, node) pairs that may serve a class: its models in order, each on its hosts."""
    return [(m, n) for m in ctx.models_for(request_class) for n in ctx.feasible_nodes(m)]


def _norm(value: float, bound: float) -> float:
    return value / bound if bound > 0 else 0.0
