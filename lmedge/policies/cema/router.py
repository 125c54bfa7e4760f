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
from dataclasses import replace
from typing import Any, Literal

import numpy as np
from pydantic import Field

from lmedge.api import (
    Capabilities,
    ClusterContext,
    Decision,
    RequestRecord,
    RequestWindow,
    Route,
    RoutingMap,
    SlotObservation,
)
from lmedge.api.base import built
from lmedge.api.constants import COLD_START_S, RADIO_WATTS
from lmedge.api.engines import NOMINAL_INPUT_TOKENS, NOMINAL_OUTPUT_TOKENS
from lmedge.errors import ConfigError
from lmedge.policies.cema.catalogue import from_context
from lmedge.policies.cema.evaluator import BatchEvaluator, Destinations, Weights, _losses
from lmedge.policies.cema.quality import (
    PriorQualityPredictor,
    QualityPredictor,
    RagQualityPredictor,
    StoreParams,
    rag_available,
)
from lmedge.policies.cema.requests import (
    METHODS,
    Batch,
    Monitor,
    Outcome,
    Request,
    RoutingState,
    SearchParams,
    route_batch,
    search,
)
from lmedge.policies.kit.estimates import Transfers, memoized
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
    radio_watts: float = Field(
        default=RADIO_WATTS, ge=0, description="Transmit power for comm energy, W."
    )
    predictor: str = Field(default="prior", pattern="^(prior|rag|store)$")
    default_quality: float = Field(default=1.0, ge=0, le=1, description="Prior when unset.")
    mode: Literal["batch", "request"] = Field(
        default="batch",
        description=(
            "batch: one gene per (origin, class) of the slot; request: one gene per request, "
            "routed in windows of window_s (requests.py)."
        ),
    )
    method: str = Field(
        default="cema",
        pattern=f"^({'|'.join(METHODS)})$",
        description="Request mode: CEMA or one of the paper's baselines (requests.METHODS).",
    )
    window_s: float = Field(default=1.0, gt=0, description="Request mode: the window, seconds.")
    window_requests: int = Field(default=128, ge=1, description="Request mode: R_m a window.")
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
        self.capabilities = Capabilities(
            routes_request_classes=True,
            routes_requests=params.mode == "request",
            window_s=params.window_s,
            window_requests=params.window_requests,
        )
        #: The search's parameters (the batch mode caps `generations` per slot).
        self.search_params = SearchParams(
            params.population,
            params.generations,
            params.p_crossover,
            params.p_mutation,
            params.tournament,
            params.elite,
            params.p_repair,
            params.repair_budget,
            params.radio_watts,
        )
        self.monitor = Monitor()
        self.state = RoutingState(rng=self.rng)
        #: The last window's outcome (assignment, raw terms, J, the seed's J, decision time).
        self.last_window: Outcome | None = None
        #: Sums over the windows routed (`lmedge.bench.summary.routing_summary`).
        self.window_totals: dict[str, float] = dict.fromkeys(
            ("windows", "requests", "j", "seed_j", "quality_loss", "cost", "energy", "makespan"),
            0.0,
        )

    def route(self, obs: SlotObservation) -> Decision[RoutingMap]:
        ev = BatchEvaluator(obs, self.predictor, self.weights, self.p.radio_watts)
        best = self.search(ev)
        routes = ev.routes(best)
        self.last_fitness = ev.fitness(best) if best else None
        return Decision[RoutingMap](
            agent="scheduler", policy=NAME, source="rule", value=RoutingMap(routes=routes)
        )

    def observe(self, records: Sequence[RequestRecord]) -> None:
        self.predictor.observe(records)

    # -- request mode ------------------------------------------------------------

    def route_requests(self, window: RequestWindow) -> list[Route]:
        """One route per request of the window (`requests.route_batch` with `method`).

        Destinations are the (node, model) pairs deployed now (paper §III-D:
        the hosted pairs), or, for a class with none, every pair on a node up,
        with a cold start added to its backlog; a node missing from the
        window's snapshot is not a destination. B_d is the router's own
        dispatch record (`Monitor`). If the method fails, the window takes
        the load-aware seed; a request no destination serves is routed to its
        origin, which the emulator's default routing replaces.
        """
        ctx = window.context
        table = Destinations.of(ctx)
        pairs = table.pairs
        catalogue = memoized(ctx, "cema.catalogue", lambda: from_context(ctx, pairs))
        up = np.zeros(len(pairs), dtype=bool)
        running = np.zeros(len(pairs), dtype=bool)
        nodes = {n.name for n in window.snapshot.nodes}
        for d, (n, _) in enumerate(pairs):
            up[d] = n in nodes
        for state in window.snapshot.nodes:
            for inst in state.instances:
                hosted = table.index.get((state.name, inst.lm))
                if hosted is not None:
                    running[hosted] = True
        requests: list[Request] = []
        rows: list[int] = []  # window position of each routed request
        legal_rows, quality_rows, net_rows = [], [], []
        for k, w in enumerate(window.requests):
            legal = np.zeros(len(pairs), dtype=bool)
            alleles = table.alleles(ctx, w.lm)
            legal[alleles] = True
            legal &= up
            if (legal & running).any():
                legal &= running  # the endpoint pool: the pairs deployed now (paper §III-D)
            elif not legal.any():
                continue
            quality = np.zeros(len(pairs))
            quality[alleles] = 1.0 - np.asarray(
                _losses(self.predictor, w.lm, [pairs[d] for d in alleles.tolist()]), dtype=float
            )
            net = np.zeros(len(pairs))
            for d in np.flatnonzero(legal).tolist():
                n, m = pairs[d]
                net[d] = Transfers(ctx, w.origin, m, w.prompts).to(n)
            model = ctx.default_model(w.lm) or w.lm
            prof = ctx.service(model).spec.profile
            requests.append(
                Request(
                    w.id,
                    w.lm,
                    w.input_tokens
                    if w.input_tokens is not None
                    else NOMINAL_INPUT_TOKENS * w.prompts,
                    w.output_tokens
                    if w.output_tokens is not None
                    else NOMINAL_OUTPUT_TOKENS * w.prompts,
                    w.prompts,
                    (prof.request_kib + prof.response_kib) * w.prompts,
                    w.origin,
                )
            )
            rows.append(k)
            legal_rows.append(legal)
            quality_rows.append(quality)
            net_rows.append(net)
        chosen: dict[int, int] = {}
        if requests:
            now = window.end_s
            backlog = self.monitor.backlog(now, pairs) + np.where(running, 0.0, COLD_START_S)
            batch = Batch(
                requests,
                catalogue,
                np.array(legal_rows),
                np.array(quality_rows),
                backlog,
                np.array(net_rows),
            )
            params, method = self.search_params, self.p.method
            try:
                out = route_batch(batch, method, self.weights, params, self.state)
            except Exception:  # the method failed: the load-aware seed routes the window
                out = route_batch(batch, "seed", self.weights, params, self.state)
            self.last_window = out
            totals = self.window_totals
            for key, value in (
                ("windows", 1.0),
                ("requests", len(requests)),
                ("j", out.j),
                ("seed_j", out.seed_j),
                ("quality_loss", out.quality_loss),
                ("cost", out.cost),
                ("energy", out.energy),
                ("makespan", out.makespan),
            ):
                totals[key] += value
            self.monitor.dispatch(now, [pairs[d] for d in out.assignment], out.busy)
            chosen = dict(zip(rows, out.assignment, strict=True))
        routes = []
        for k, w in enumerate(window.requests):
            pick = chosen.get(k)
            node, model = (w.origin, w.lm) if pick is None else pairs[pick]
            routes.append(
                built(
                    Route,
                    {
                        "origin": w.origin,
                        "lm": w.lm,
                        "destination": node,
                        "model": None if model == w.lm else model,
                    },
                )
            )
        return routes

    # -- memetic search --------------------------------------------------------

    def search(self, ev: BatchEvaluator) -> list[int]:
        """The best chromosome (a destination per gene); advances `self.rng` as it draws."""
        if not ev.genes:
            return []
        self.last_generations = self.generations(len(ev.genes))
        return search(ev, replace(self.search_params, generations=self.last_generations), self.rng)

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
