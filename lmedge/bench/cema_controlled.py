"""CEMA-Router's controlled experiments (§V-C, Fig. 2): the optimizer on generated batches.

The paper's controlled stage routes RouterBench batches over a simulated
five-node cloud-edge profile (its Table II) with the router's own evaluator,
no serving system. lmedge has neither RouterBench's data nor Table II's
figures, so here:

- prompts are the quality store's `workload` prompts (never indexed; real
  text from `policies/cema/dataset.py`), q̂ per destination is the store's
  Eq. 3 estimate at the destination's store model, input tokens follow the
  text (1.3 tokens a word + a 40-token instruction), output tokens are drawn
  per family (`OUTPUT_TOKENS`, lognormal; assumption);
- the catalogue (`CATALOGUE`) is five nodes, two cloud and three edge, with
  11 (node, model) destinations; throughput, power, latency and token
  prices are assumptions in the ranges the paper states (cloud 40-60 ms with
  token prices, edge 5-8 ms, self-hosted price 0); M > 11 replicates it, as
  the paper does;
- a run is a stream of B windows Δ = 1 s apart, each of R requests: every
  method keeps its own `requests.Monitor`, so B_d is the backlog its own
  earlier windows left (paper §III-B), and every outcome is scored by the
  one `RequestEvaluator` (J, raw terms, the seed's J).

UniRoute is the `uniroute.UniRouter` over the same store (its k-means
clusters and per-cluster errors); here it scores each prompt's
destinations with err(cluster(x), model) + λ · cost / max cost
(`UniRouter.choose_requests`: its `pick` rule per request instead of per
class). Its decision time covers
that scoring only (embeddings are precomputed for every method).

Not here: the emulated deployment (`cema_repro.py`) and the report.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cache
from typing import Any

import numpy as np

from lmedge.policies.cema.catalogue import Destination
from lmedge.policies.cema.dataset import load as load_prompts
from lmedge.policies.cema.evaluator import Weights
from lmedge.policies.cema.quality import StoreParams
from lmedge.policies.cema.requests import (
    Monitor,
    Outcome,
    Request,
    RequestEvaluator,
    RoutingState,
    SearchParams,
    controlled_batch,
    route_batch,
)
from lmedge.policies.cema.store import QualityStore
from lmedge.policies.cema.uniroute import UniRouteParams, UniRouter

Array = np.ndarray[Any, Any]

#: The paper's default weights (wQ, wC, wE, wT).
WEIGHTS = Weights(0.25, 0.25, 0.25, 0.25)
#: Routing window Δ, seconds (paper §V-B).
WINDOW_S = 1.0
#: UniRoute: the method name the controlled experiments give it.
UNIROUTE = "uniroute"

#: Output tokens per family: (mean, sigma of the log); assumption (zero-shot CoT answers).
OUTPUT_TOKENS: dict[str, tuple[float, float]] = {
    "arithmetic": (180.0, 0.5),
    "choice": (120.0, 0.5),
    "summary": (60.0, 0.4),
}


#: Per node: (tier, board watts, utilization, one-way latency s, goodput bit/s). Assumption:
#: cloud nodes are 8-GPU servers (H100, A100) 40-60 ms away, edge a 4090, an L4 and a
#: Jetson Orin 5-8 ms away (the paper's Table II ranges).
NODES: dict[str, tuple[str, float, float, float, float]] = {
    "cloud-h100": ("cloud", 5600.0, 0.6, 0.05, 1e9),
    "cloud-a100": ("cloud", 3200.0, 0.6, 0.04, 1e9),
    "edge-4090": ("edge", 450.0, 0.7, 0.005, 5e8),
    "edge-l4": ("edge", 72.0, 0.7, 0.006, 5e8),
    "edge-orin": ("edge", 40.0, 0.7, 0.008, 2e8),
}
#: Token prices per 1k tokens (input = output) of a cloud-hosted model; assumption in
#: RouterBench's range for hosted open models. Edge destinations are self-hosted (0).
CLOUD_PRICE_PER_1K = {"latent-70b": 0.0009, "latent-30b": 0.0008, "latent-8b": 0.0002}
#: The 11 destinations: (node, store model, prefill tok/s, F_1, F_B). Assumption: decode
#: rates from memory bandwidth / weight bytes, F_B ~8-16 x F_1 (continuous batching).
DESTINATIONS: tuple[tuple[str, str, float, float, float], ...] = (
    ("cloud-h100", "latent-70b", 12000.0, 45.0, 700.0),
    ("cloud-h100", "latent-30b", 20000.0, 70.0, 1100.0),
    ("cloud-h100", "latent-8b", 40000.0, 140.0, 2200.0),
    ("cloud-a100", "latent-70b", 7000.0, 30.0, 450.0),
    ("cloud-a100", "latent-30b", 12000.0, 45.0, 700.0),
    ("edge-4090", "latent-8b", 4000.0, 60.0, 500.0),
    ("edge-4090", "latent-3b", 8000.0, 120.0, 1000.0),
    ("edge-l4", "latent-3b", 2500.0, 45.0, 350.0),
    ("edge-l4", "latent-1b", 5000.0, 90.0, 700.0),
    ("edge-orin", "latent-1b", 1200.0, 35.0, 250.0),
    ("edge-orin", "latent-0.3b", 3000.0, 80.0, 600.0),
)


def _destination(node: str, model: str, prefill: float, f1: float, fb: float) -> Destination:
    tier, watts, util, latency, goodput = NODES[node]
    price = CLOUD_PRICE_PER_1K.get(model, 0.0) if tier == "cloud" else 0.0
    return Destination(
        node=node,
        model=model,
        tier=tier,
        input_price_per_1k=price,
        output_price_per_1k=price,
        prefill_tokens_per_s=prefill,
        single_tokens_per_s=f1,
        batch_tokens_per_s=fb,
        watts=watts,
        utilization=util,
        latency_s=latency,
        goodput_bps=goodput,
    )


#: The controlled catalogue (the paper's Table II analog; every value an assumption).
CATALOGUE: tuple[Destination, ...] = tuple(_destination(*row) for row in DESTINATIONS)


def catalogue(m: int) -> list[Destination]:
    """The first `m` destinations of the catalogue replicated (copy k's nodes suffixed -k)."""
    if m < 1:
        raise ValueError(f"a catalogue needs at least one destination, got {m}")
    base = list(CATALOGUE)
    out = []
    for i in range(m):
        d = base[i % len(base)]
        k = i // len(base)
        out.append(d if k == 0 else replace(d, node=f"{d.node}-{k}"))
    return out


@dataclass(frozen=True)
class Prompt:
    """A workload prompt of the store with what a request needs of it."""

    id: str
    family: str
    input_tokens: int
    embedding: Array
    quality: Array  # q̂ per store model (Eq. 3)


@cache
def store() -> QualityStore:
    """The shipped quality store (needs the `cema` extra: faiss)."""
    return StoreParams().load()


@cache
def prompts() -> tuple[Prompt, ...]:
    """The store's workload prompts with their token counts and q̂ per store model."""
    s = store()
    text = {r.id: r.prompt for r in load_prompts()}
    out = []
    for pid in s.workload_ids():
        emb = s.embedding(pid)
        family = s.families[s.ids.index(pid)]
        tokens = 40 + round(1.3 * len(text[pid].split()))
        out.append(Prompt(pid, family, tokens, emb, np.asarray(s.predict_all(emb))))
    return tuple(out)


def uniroute(context: Any, seed: int = 0) -> UniRouter:
    """UniRoute over the shipped store (k-means from `seed`); `context` any cluster's."""
    return UniRouter(context, seed, UniRouteParams(), store())


@dataclass
class Stream:
    """A seeded stream of B batches of R prompts, with drawn output tokens."""

    batches: list[list[tuple[Prompt, int]]]

    @classmethod
    def draw(cls, r: int, b: int, seed: int) -> Stream:
        rng = random.Random(seed)
        pool = prompts()
        out = []
        for _ in range(b):
            batch = []
            for p in rng.sample(pool, r):
                mean, sigma = OUTPUT_TOKENS.get(p.family, (120.0, 0.5))
                mu = np.log(mean) - sigma**2 / 2
                batch.append((p, max(1, round(rng.lognormvariate(mu, sigma)))))
            out.append(batch)
        return cls(out)


def run_stream(
    stream: Stream,
    dests: Sequence[Destination],
    method: str,
    *,
    seed: int = 0,
    params: SearchParams | None = None,
    scorer: UniRouter | None = None,
) -> list[Outcome]:
    """Route the stream's windows with `method` (a `requests.METHODS` name or `uniroute`).

    Window b arrives at b x Δ; B_d is the method's own `Monitor` then.
    """
    s = store()
    column = [s.models.index(d.model) for d in dests]
    pairs = [(d.node, d.model) for d in dests]
    monitor = Monitor()
    state = RoutingState(rng=random.Random(seed))
    out = []
    for k, batch in enumerate(stream.batches):
        now = k * WINDOW_S
        reqs = [Request(f"{k}-{i}", p.family, p.input_tokens, o) for i, (p, o) in enumerate(batch)]
        quality = np.array([p.quality[column] for p, _ in batch])
        b = controlled_batch(reqs, dests, quality, monitor.backlog(now, pairs))
        if method == UNIROUTE:
            if scorer is None:
                raise ValueError("uniroute needs a scorer")
            ev = RequestEvaluator(b, WEIGHTS, (params or SearchParams()).radio_watts)
            t0 = time.perf_counter()
            chosen = scorer.choose_requests(ev, [p.embedding for p, _ in batch])
            decision = time.perf_counter() - t0
            q, c, e, t = ev.raw(chosen)
            busy = [float(ev.busy[i, d]) for i, d in enumerate(chosen)]
            res = Outcome(
                chosen, ev.fitness(chosen), q, c, e, t, decision, ev.fitness(ev.seed.tolist()), busy
            )
        else:
            res = route_batch(b, method, WEIGHTS, params, state)
        monitor.dispatch(now, [pairs[d] for d in res.assignment], res.busy)
        out.append(res)
    return out


def warm_up() -> None:
    """Compile (or load) the search kernel, so no decision time counts it."""
    run_stream(Stream.draw(4, 1, 0), catalogue(3), "cema")
