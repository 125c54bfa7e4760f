"""UniRoute, CEMA-Router's quality-cost baseline (seed §V, "Baselines"), as an lmedge router.

UniRoute clusters prompts by embedding, estimates each model's error rate per
cluster, and sends a prompt to the model minimizing

    score(x, d) = err(cluster(x), model(d)) + lambda * cost(d) / max_d' cost(d')

with lambda = 0.05 (the paper's RouterBench setting) and the max over the
prompt's legal destinations (0 when every one is free). It reads the same
quality store as CEMA (`store.QualityStore`), as the paper holds the quality
source fixed between the two:

- k-means (Lloyd, k-means++ initialisation from the plugin seed, `iterations`
  rounds) over the store's profiled prompt embeddings gives `clusters`
  centroids; err(c, m) = 1 - mean score of cluster c's prompts at m (a
  cluster left empty takes the model's overall mean);
- a prompt's errors are its nearest centroid's row (`prompt_errors`); a
  request class's are the mean over its family's profiled prompts of their
  clusters' rows (`class_errors`), since lmedge routes classes per slot.
  A destination whose model the store lacks has error 1 - its prior.

It is infrastructure-blind by design: no backlog, network, power or
makespan; among equal scores the first legal destination wins (the class's
models in `models_for` order, each on its nodes in `feasible_nodes` order).

Cost seam: `unit_cost` prices one prompt at each destination as CEMA's
evaluator does (busy seconds x the node's price per hour); when the catalogue
gains token prices, that function is the one place to change.
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
    RoutingMap,
    SlotObservation,
)
from lmedge.api.constants import RADIO_WATTS
from lmedge.errors import ConfigError
from lmedge.policies.cema.evaluator import BatchEvaluator, Weights
from lmedge.policies.cema.quality import (
    StoreParams,
    StoreQualityPredictor,
    prior_quality,
    rag_available,
)
from lmedge.policies.cema.requests import RequestEvaluator
from lmedge.policies.cema.store import QualityStore
from lmedge.policies.kit.params import PluginParams, parse_params

NAME = "uniroute"
Array = np.ndarray[Any, Any]


class UniRouteParams(PluginParams):
    clusters: int = Field(default=12, ge=1, description="k of k-means over prompt embeddings.")
    iterations: int = Field(default=25, ge=1, description="Lloyd rounds of k-means.")
    cost_weight: float = Field(
        default=0.05, ge=0, description="lambda, weight of the normalized cost (paper: 0.05)."
    )
    default_quality: float = Field(default=1.0, ge=0, le=1, description="Prior when unset.")
    store: StoreParams = Field(default_factory=lambda: StoreParams())


def kmeans(points: Array, k: int, iterations: int, seed: int) -> tuple[Array, Array]:
    """(centroids, assignment): Lloyd's k-means, k-means++ seeded, deterministic for a seed."""
    rng = random.Random(seed)
    n = len(points)
    k = min(k, n)
    centroids = [points[rng.randrange(n)]]
    for _ in range(1, k):
        d2 = np.min([((points - c) ** 2).sum(axis=1) for c in centroids], axis=0)
        total = float(d2.sum())
        if total <= 0:
            break
        pick = int(np.searchsorted(np.cumsum(d2), rng.random() * total, side="right"))
        centroids.append(points[min(pick, n - 1)])
    c = np.array(centroids, dtype=np.float64)
    x = points.astype(np.float64)
    assign = np.zeros(n, dtype=np.int64)
    for _ in range(iterations):
        assign = np.argmin(((x[:, None, :] - c[None, :, :]) ** 2).sum(axis=2), axis=1)
        for j in range(len(c)):
            members = x[assign == j]
            if len(members):
                c[j] = members.mean(axis=0)
    return c, assign


def unit_cost(ev: BatchEvaluator) -> Array:
    """Cost of one prompt at each destination: seconds a prompt x price per second."""
    per, price = ev.slot.dest[:, 0], ev.slot.dest[:, 1]
    return np.asarray(np.where(price > 0, per * price / 3600.0, 0.0), dtype=np.float64)


class UniRouter:
    """The `uniroute` router plugin: per-cluster error + lambda x normalized cost."""

    name = NAME
    capabilities = Capabilities(routes_request_classes=True)

    def __init__(
        self,
        context: ClusterContext,
        seed: int,
        params: UniRouteParams,
        store: QualityStore,
    ) -> None:
        self.context = context
        self.p = params
        self.store = store
        self.quality = StoreQualityPredictor(
            context, store, params.store.models, params.store.classes, params.default_quality
        )
        rows = store.profile_rows()
        self.centroids, assign = kmeans(
            store.embeddings[rows], params.clusters, params.iterations, seed
        )
        scores = store.scores[rows].astype(np.float64)
        overall = scores.mean(axis=0)
        self.errors = np.array(
            [
                1.0 - (scores[assign == j].mean(axis=0) if (assign == j).any() else overall)
                for j in range(len(self.centroids))
            ]
        )
        self._cluster_of_row = dict(zip(rows.tolist(), assign.tolist(), strict=True))
        self._class_errors: dict[str, Array] = {}
        self.last_fitness: float | None = None

    def cluster(self, query: Array) -> int:
        """The nearest centroid of a prompt embedding."""
        q = np.asarray(query, dtype=np.float64).reshape(1, -1)
        return int(np.argmin(((self.centroids - q) ** 2).sum(axis=1)))

    def prompt_errors(self, query: Array) -> Array:
        """err(cluster(x), m) for every store model."""
        return np.asarray(self.errors[self.cluster(query)])

    def class_errors(self, request_class: str) -> Array:
        """Mean over the class's profiled prompts of their cluster's errors, per store model."""
        if request_class not in self._class_errors:
            rows = self.store.profile_rows(self.quality.family(request_class))
            clusters = [self._cluster_of_row[r] for r in rows.tolist()]
            self._class_errors[request_class] = self.errors[clusters].mean(axis=0)
        return self._class_errors[request_class]

    def error(self, request_class: str, model: str) -> float:
        """Expected error of a destination model on a request class."""
        name = self.quality.store_model(model)
        if name is None:
            return 1.0 - prior_quality(self.context, model, self.p.default_quality)
        return float(self.class_errors(request_class)[self.store.models.index(name)])

    def pick(self, errors: Array, cost: Array) -> int:
        """The position of the least err + lambda x cost / max cost (the first of equals).

        `errors` and `cost` are the candidates' errors and costs in one order;
        the cost term is 0 for all when every candidate is free.
        """
        top = float(cost.max()) if len(cost) else 0.0
        norm = cost / top if top > 0 else np.zeros(len(cost))
        score = [
            float(e) + self.p.cost_weight * float(n) for e, n in zip(errors, norm, strict=True)
        ]
        return int(np.argmin(score))

    def choose(self, ev: BatchEvaluator) -> list[int]:
        """A destination per gene (the class's errors): `pick` over its legal destinations."""
        cost = unit_cost(ev)
        choice = []
        for gene, alleles in zip(ev.genes, ev.legal, strict=True):
            dests = alleles.tolist()
            errors = np.array([self.error(gene.lm, ev.dests[d][1]) for d in dests])
            choice.append(dests[self.pick(errors, cost[alleles])])
        return choice

    def choose_requests(self, ev: RequestEvaluator, embeddings: Sequence[Array]) -> list[int]:
        """A destination per request of a request-level batch (its prompt's cluster errors):
        `pick` over its legal destinations, priced as CEMA's evaluator prices them.

        The batch's destinations name store models (a controlled catalogue).
        """
        b, cost = ev.batch, ev.slot.direct[:, :, 1]
        column = {m: k for k, m in enumerate(self.store.models)}
        out = []
        for i, emb in enumerate(embeddings):
            legal = np.flatnonzero(b.legal[i])
            err = self.prompt_errors(emb)
            errors = np.array([err[column[b.dests[d].model]] for d in legal.tolist()])
            out.append(int(legal[self.pick(errors, cost[i, legal])]))
        return out

    def route(self, obs: SlotObservation) -> Decision[RoutingMap]:
        # CEMA's evaluator for the legal destinations and, for comparison, J of the choice
        ev = BatchEvaluator(obs, self.quality, Weights(0.25, 0.25, 0.25, 0.25), RADIO_WATTS)
        best = self.choose(ev)
        routes = ev.routes(best)
        self.last_fitness = ev.fitness(best) if best else None
        return Decision[RoutingMap](
            agent="scheduler", policy=NAME, source="rule", value=RoutingMap(routes=routes)
        )


def build(context: ClusterContext, seed: int, params: Mapping[str, Any]) -> UniRouter:
    p = parse_params(UniRouteParams, params, NAME)
    missing = rag_available()
    if missing:
        raise ConfigError(f"{NAME}: {missing}")
    return UniRouter(context, seed, p, p.store.load())
