"""CEMA-Router: memetic batch routing (seed `cema-router.txt`, §IV), as an lmedge router.

Per slot: build the `BatchEvaluator`, seed a population with one load-aware
chromosome (largest batch first, each to the destination with the earliest
estimated finish: backlog + service + network) and random legal ones, then
evolve for `generations` generations (fewer when `population` x genes a
generation would pass `search_budget`, at least one):

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

import numpy as np
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
from lmedge.api.base import built
from lmedge.errors import ConfigError
from lmedge.policies.cema import kernel
from lmedge.policies.cema.evaluator import BatchEvaluator, Weights
from lmedge.policies.cema.quality import (
    PriorQualityPredictor,
    QualityPredictor,
    RagQualityPredictor,
    StoreParams,
    rag_available,
)
from lmedge.policies.kit.params import PluginParams, parse_params

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
    search_budget: int | None = Field(
        default=1_000_000,
        ge=1,
        description=(
            "Genes scored per slot (population x genes per generation): above it the slot "
            "runs fewer generations (at least one); null: always `generations`."
        ),
    )
    w_quality: float = Field(default=0.25, ge=0)
    w_cost: float = Field(default=0.25, ge=0)
    w_energy: float = Field(default=0.25, ge=0)
    w_time: float = Field(default=0.25, ge=0)
    radio_watts: float = Field(default=2.0, ge=0, description="Transmit power for comm energy, W.")
    predictor: str = Field(default="prior", pattern="^(prior|rag|store)$")
    default_quality: float = Field(default=1.0, ge=0, le=1, description="Prior when unset.")
    store: StoreParams = Field(
        default_factory=lambda: StoreParams(), description="The quality store (`store`)."
    )


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
        self.last_generations = 0

    def route(self, obs: SlotObservation) -> Decision[RoutingMap]:
        ev = BatchEvaluator(obs, self.predictor, self.weights, self.p.radio_watts)
        best = self.search(ev)
        # trusted names (the context's and the arrivals'): no revalidation
        routes = [
            built(
                Route,
                {
                    "origin": g.origin,
                    "lm": g.lm,
                    "destination": ev.dests[d][0],
                    "model": None if ev.dests[d][1] == g.lm else ev.dests[d][1],
                },
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
        """The best chromosome (a destination per gene); advances `self.rng` as it draws."""
        if not ev.genes:
            return []
        p = self.p
        self.last_generations = self.generations(len(ev.genes))
        version, words, gauss = self.rng.getstate()
        mt = np.array(words[:-1], dtype=np.uint32)
        pos = np.array([words[-1]], dtype=np.int64)
        best = kernel.search(
            ev.slot,
            ev.radio_watts,
            ev.seed,
            ev.bounds,
            ev.weight_array,
            np.array([p.p_crossover, p.p_mutation, p.p_repair]),
            np.array(
                [p.population, self.last_generations, p.tournament, p.elite, p.repair_budget],
                dtype=np.int64,
            ),
            mt,
            pos,
        )
        self.rng.setstate((version, (*mt.tolist(), int(pos[0])), gauss))
        return list(best.tolist())

    def generations(self, genes: int) -> int:
        """Generations for a slot of `genes` genes: `generations`, fewer past `search_budget`."""
        p = self.p
        if p.search_budget is None or genes == 0:
            return p.generations
        return min(p.generations, max(1, p.search_budget // (p.population * genes)))

    @staticmethod
    def load_aware(ev: BatchEvaluator) -> list[int]:
        """Largest batch first, each to the destination that would finish it earliest."""
        return list(ev.seed.tolist())


def build(context: ClusterContext, seed: int, params: Mapping[str, Any]) -> CemaRouter:
    p = parse_params(CemaParams, params, NAME)
    predictor: QualityPredictor
    if p.predictor in ("rag", "store"):
        missing = rag_available()
        if missing:
            raise ConfigError(f"cema predictor={p.predictor}: {missing}")
    if p.predictor == "rag":
        predictor = RagQualityPredictor(context, default=p.default_quality)
    elif p.predictor == "store":
        predictor = p.store.predictor(context, p.default_quality)
    else:
        predictor = PriorQualityPredictor(context, default=p.default_quality)
    return CemaRouter(context, seed, p, predictor)
