"""CEMA's evaluator and memetic search as plain Python over dictionaries: the test oracle.

This is the implementation the compiled kernel replaced (lmedge 0.x, before
issue 17), kept term for term: the kernel must give the same routes, the same
fitness and leave the random generator in the same state.
"""

from __future__ import annotations

import random
from collections.abc import Iterable

from lmedge.api import ClusterContext, PowerProfile, SlotObservation
from lmedge.policies.cema import CemaParams, Gene, Weights
from lmedge.policies.cema.quality import QualityPredictor
from lmedge.policies.kit.estimates import backlog_s, service_s, serving_mode, transfer_s


class ReferenceEvaluator:
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
        pairs = zip(self.weight, self.loss, strict=True)
        self.q_ub = _in_order(w * max(t.values()) for w, t in pairs)
        self.c_ub = _in_order(max(t.values()) for t in self.cost)
        self.e_ub = _in_order(max(t.values()) for t in self.energy)
        self.t_ub = (
            max(self.backlog, default=0.0)
            + _in_order(max(t.values()) for t in self.service)
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
        q = _in_order(self.weight[g] * self.loss[g][d] for g, d in enumerate(chromosome))
        c = _in_order(self.cost[g][d] for g, d in enumerate(chromosome))
        e = _in_order(self.energy[g][d] for g, d in enumerate(chromosome))
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


def _in_order(values: Iterable[float]) -> float:
    """Left to right, as `sum` added floats up to Python 3.11 (3.12's `sum` compensates)."""
    total = 0.0
    for v in values:
        total += v
    return total


def _norm(value: float, bound: float) -> float:
    return value / bound if bound > 0 else 0.0


class ReferenceSearch:
    """`CemaRouter`'s memetic search as it was, over a `ReferenceEvaluator`."""

    def __init__(self, params: CemaParams, rng: random.Random) -> None:
        self.p = params
        self.rng = rng

    def search(self, ev: ReferenceEvaluator) -> list[int]:
        if not ev.genes:
            return []
        p, rng = self.p, self.rng
        pop = [self.load_aware(ev)]
        pop += [[rng.choice(legal) for legal in ev.legal] for _ in range(p.population - 1)]
        scored = sorted(((ev.fitness(c), c) for c in pop), key=lambda t: t[0])
        for _ in range(p.generations):
            nxt = scored[: p.elite]
            while len(nxt) < p.population:
                a, b = self._pick(scored), self._pick(scored)
                child = self._crossover(a, b) if rng.random() < p.p_crossover else list(a)
                self._mutate(ev, child)
                fit = ev.fitness(child)
                if rng.random() < p.p_repair:
                    child, fit = self._repair(ev, child, fit)
                nxt.append((fit, child))
            scored = sorted(nxt, key=lambda t: t[0])
        return scored[0][1]

    @staticmethod
    def load_aware(ev: ReferenceEvaluator) -> list[int]:
        """Largest batch first, each to the destination that would finish it earliest."""
        finish = list(ev.backlog)
        chromosome = [0] * len(ev.genes)
        for g in sorted(range(len(ev.genes)), key=lambda g: (-ev.genes[g].prompts, g)):
            d = min(ev.legal[g], key=lambda d: finish[d] + ev.service[g][d] + ev.transfer[g][d])
            chromosome[g] = d
            finish[d] += ev.service[g][d]
        return chromosome

    def _pick(self, scored: list[tuple[float, list[int]]]) -> list[int]:
        contenders = [self.rng.randrange(len(scored)) for _ in range(self.p.tournament)]
        return scored[min(contenders)][1]  # `scored` is sorted: lowest index = fittest

    def _crossover(self, a: list[int], b: list[int]) -> list[int]:
        n = len(a)
        if n < 2:
            return list(a)
        i, j = sorted(self.rng.sample(range(n + 1), 2))
        return a[:i] + b[i:j] + a[j:]

    def _mutate(self, ev: ReferenceEvaluator, child: list[int]) -> None:
        for g, legal in enumerate(ev.legal):
            if len(legal) > 1 and self.rng.random() < self.p.p_mutation:
                child[g] = self.rng.choice(legal)

    def _repair(
        self, ev: ReferenceEvaluator, child: list[int], fit: float
    ) -> tuple[list[int], float]:
        """Best improving worst-gene move or 2-opt swap within the budget (Lamarckian)."""
        budget = self.p.repair_budget
        best, best_fit = child, fit
        completion = ev.completion(child)
        worst = max(range(len(child)), key=lambda g: completion[g])
        alternatives = [d for d in ev.legal[worst] if d != child[worst]]
        self.rng.shuffle(alternatives)
        for d in alternatives[: budget // 2 or 1]:
            trial = list(child)
            trial[worst] = d
            f = ev.fitness(trial)
            budget -= 1
            if f < best_fit:
                best, best_fit = trial, f
        while budget > 0 and len(child) > 1:
            g1, g2 = self.rng.sample(range(len(child)), 2)
            budget -= 1
            if child[g2] not in ev.legal[g1] or child[g1] not in ev.legal[g2]:
                continue
            trial = list(child)
            trial[g1], trial[g2] = child[g2], child[g1]
            f = ev.fitness(trial)
            if f < best_fit:
                best, best_fit = trial, f
        return best, best_fit
