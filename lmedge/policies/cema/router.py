"""CEMA-Router: memetic batch routing (seed `cema-router.txt`, §IV), as an lmedge router.

Per slot: build the `BatchEvaluator`, seed a population with one load-aware
chromosome (largest batch first, each to the destination with the earliest
estimated finish: backlog + service + network) and random legal ones, then
evolve for `generations` generations:

- elitism: the `elite` best survive unchanged;
- parents by tournament (size `tournament`), two-point crossover with
  probability `p_crossover`, per-gene mutation to a random legal destination
  with probability `p_mutation`;
- probabilistic Lamarckian repair (probability `p_repair`, at most
  `repair_budget` evaluator calls): worst-gene repair (move the gene whose
  completion time sets the makespan to another legal destination) and 2-opt
  swap (exchange two genes' destinations when both stay legal); the best
  improving move is written back into the child.

The best chromosome found is returned (anytime). Randomness comes from a
`random.Random` seeded by the plugin seed, so a run is reproducible.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import Field

from lmedge.api import (
    Capabilities,
    ClusterContext,
    Decision,
    RequestRecord,
    Route,
    RoutingMap,
    SlotObservation,
)
from lmedge.errors import ConfigError
from lmedge.policies.cema.evaluator import BatchEvaluator, Weights
from lmedge.policies.cema.quality import (
    PriorQualityPredictor,
    QualityPredictor,
    RagQualityPredictor,
    rag_available,
)
from lmedge.policies.lyapunov.params import PluginParams, parse_params

NAME = "cema"


class CemaParams(PluginParams):
    population: int = Field(default=30, ge=2, description="P, chromosomes per generation.")
    generations: int = Field(default=20, ge=0, description="G, generations per slot.")
    p_crossover: float = Field(default=0.9, ge=0, le=1)
    p_mutation: float = Field(default=0.1, ge=0, le=1, description="Per-gene mutation rate.")
    tournament: int = Field(default=3, ge=1)
    elite: int = Field(default=2, ge=0)
    p_repair: float = Field(default=0.5, ge=0, le=1, description="Lamarckian repair probability.")
    repair_budget: int = Field(default=8, ge=0, description="L, evaluator calls per repair.")
    w_quality: float = Field(default=0.25, ge=0)
    w_cost: float = Field(default=0.25, ge=0)
    w_energy: float = Field(default=0.25, ge=0)
    w_time: float = Field(default=0.25, ge=0)
    radio_watts: float = Field(default=2.0, ge=0, description="Transmit power for comm energy, W.")
    predictor: str = Field(default="prior", pattern="^(prior|rag)$")
    default_quality: float = Field(default=1.0, ge=0, le=1, description="Prior when unset.")


class CemaRouter:
    """The `cema` router plugin; a `FeedbackConsumer` (feeds the quality predictor)."""

    name = NAME
    #: The controller passes request-class arrivals through: genes choose the model.
    capabilities = Capabilities(routes_request_classes=True)

    def __init__(
        self, context: ClusterContext, seed: int, params: CemaParams, predictor: QualityPredictor
    ) -> None:
        self.context = context
        self.p = params
        self.rng = random.Random(seed)
        self.predictor = predictor
        self.weights = Weights(params.w_quality, params.w_cost, params.w_energy, params.w_time)
        self.last_fitness: float | None = None

    def route(self, obs: SlotObservation) -> Decision[RoutingMap]:
        ev = BatchEvaluator(obs, self.predictor, self.weights, self.p.radio_watts)
        best = self.search(ev)
        routes = [
            Route(
                origin=g.origin,
                lm=g.lm,
                destination=ev.dests[d][0],
                model=None if ev.dests[d][1] == g.lm else ev.dests[d][1],
            )
            for g, d in zip(ev.genes, best, strict=True)
        ]
        self.last_fitness = ev.fitness(best) if best else None
        return Decision[RoutingMap](
            agent="scheduler", policy=NAME, source="rule", value=RoutingMap(routes=routes)
        )

    def observe(self, records: Sequence[RequestRecord]) -> None:
        self.predictor.observe(records)

    # -- memetic search --------------------------------------------------------

    def search(self, ev: BatchEvaluator) -> list[int]:
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
    def load_aware(ev: BatchEvaluator) -> list[int]:
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

    def _mutate(self, ev: BatchEvaluator, child: list[int]) -> None:
        for g, legal in enumerate(ev.legal):
            if len(legal) > 1 and self.rng.random() < self.p.p_mutation:
                child[g] = self.rng.choice(legal)

    def _repair(self, ev: BatchEvaluator, child: list[int], fit: float) -> tuple[list[int], float]:
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


def build(context: ClusterContext, seed: int, params: Mapping[str, Any]) -> CemaRouter:
    p = parse_params(CemaParams, params, NAME)
    predictor: QualityPredictor
    if p.predictor == "rag":
        missing = rag_available()
        if missing:
            raise ConfigError(f"cema predictor=rag: {missing}")
        predictor = RagQualityPredictor(context, default=p.default_quality)
    else:
        predictor = PriorQualityPredictor(context, default=p.default_quality)
    return CemaRouter(context, seed, p, predictor)
