"""CEMA's quality store: dataset, MiniLM+FAISS store, q_hat, the online window, UniRoute."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from lmedge.api import ClusterContext, NodeInfo, PowerProfile, RequestRecord
from lmedge.errors import ConfigError
from lmedge.policies.cema import (
    RagQualityPredictor,
    StoreQualityPredictor,
    build,
    dataset,
    rag_available,
)
from lmedge.policies.cema.store import STORE_FILE, QualityStore, file_sha256, minilm
from lmedge.policies.cema.uniroute import UniRouteParams, UniRouter, kmeans, unit_cost
from tests.unit.policies.lyapunov.scenario import paper_testbed, slot_obs

needs_cema = pytest.mark.skipif(rag_available() is not None, reason=str(rag_available()))
TG = "text-generation"  # served by lm1 and lm2 on the paper testbed


def hashed(texts: Sequence[str], dim: int = 64) -> np.ndarray[Any, Any]:
    """A deterministic stand-in embedder (word hashing), unit rows."""
    out = np.zeros((len(texts), dim), dtype=np.float32)
    for i, t in enumerate(texts):
        for w in t.lower().split():
            out[i, int(hashlib.sha256(w.encode()).hexdigest(), 16) % dim] += 1.0
    return out / np.linalg.norm(out, axis=1, keepdims=True)


def tiny_store(**kw: Any) -> QualityStore:
    """Three profiled prompts on two axes, one workload prompt, models a and b."""
    s = np.sqrt(0.5)
    return QualityStore(
        ids=["p0", "p1", "p2", "w0"],
        families=["f", "f", "g", "f"],
        splits=["profile", "profile", "profile", "workload"],
        models=["a", "b"],
        embeddings=np.array([[1, 0], [s, s], [0, 1], [1, 0]], dtype=np.float32),
        scores=np.array([[1.0, 0.0], [0.0, 1.0], [0.5, 0.5], [0.0, 0.0]], dtype=np.float32),
        **kw,
    )


# -- the dataset -------------------------------------------------------------


def test_committed_dataset_is_the_generator_at_seed_0() -> None:
    assert dataset.DATA_FILE.read_text() == dataset.dumps(dataset.generate(0))
    assert dataset.dumps(dataset.generate(1, 20)) == dataset.dumps(dataset.generate(1, 20))
    assert dataset.dumps(dataset.generate(1, 20)) != dataset.dumps(dataset.generate(2, 20))


def test_dataset_rows_follow_the_latent_skill_model() -> None:
    rows = dataset.load()
    assert {r.family for r in rows} == set(dataset.FAMILIES)
    assert {r.split for r in rows} == {"profile", "workload"}
    for family, (_, _, scoring) in dataset.FAMILIES.items():
        mine = [r for r in rows if r.family == family]
        assert len(mine) == 240
        if scoring == "exact":
            assert all(v in (0.0, 1.0) for r in mine for v in r.scores.values())
        means = [np.mean([r.scores[m] for r in mine]) for m in dataset.MODELS]
        # skill rises with model size, so does every family's mean score
        assert means == sorted(means), family
        easy = [r for r in mine if r.difficulty < np.median([x.difficulty for x in mine])]
        hard = [r for r in mine if r not in easy]
        for m in dataset.MODELS:
            assert np.mean([r.scores[m] for r in easy]) >= np.mean([r.scores[m] for r in hard])


def test_a_bad_dataset_row_names_its_line(tmp_path: Any) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(dataset.dumps(dataset.generate(0, 1)) + '{"id": "x"}\n')
    with pytest.raises(ConfigError, match=r"bad.jsonl:4"):
        dataset.load(path)


# -- the store ---------------------------------------------------------------


@needs_cema
def test_committed_store_is_built_from_the_committed_dataset() -> None:
    store = QualityStore.load()
    rows = dataset.load()
    assert store.source_sha256 == file_sha256(dataset.DATA_FILE)
    assert store.ids == [r.id for r in rows]
    assert store.models == list(dataset.MODELS)
    want = np.array([[r.scores[m] for m in store.models] for r in rows], dtype=np.float32)
    assert np.array_equal(store.scores, want)
    assert store.embeddings.shape == (len(rows), 384)
    assert np.allclose(np.linalg.norm(store.embeddings, axis=1), 1.0, atol=1e-5)


@pytest.mark.slow
@needs_cema
def test_committed_store_holds_minilm_embeddings() -> None:
    store, rows = QualityStore.load(), dataset.load()
    picks = [0, 300, len(rows) - 1]
    again = minilm()([rows[k].prompt for k in picks])
    assert np.allclose(again, store.embeddings[picks], atol=1e-4)


@needs_cema
def test_store_build_is_deterministic_for_a_seed(tmp_path: Any) -> None:
    rows = dataset.generate(3, 30)
    first, second = (QualityStore.build(rows, hashed) for _ in range(2))
    first.save(tmp_path / "s.npz")
    loaded = QualityStore.load(tmp_path / "s.npz")
    for other in (second, loaded):
        assert np.array_equal(first.embeddings, other.embeddings)
        assert np.array_equal(first.scores, other.scores)
        assert [first.predict_all(q).tolist() for q in first.embeddings] == [
            other.predict_all(q).tolist() for q in first.embeddings
        ]


@needs_cema
@pytest.mark.parametrize(
    ("top_k", "query", "expected_a"),
    [
        # neighbours p0 (s=1) and p1 (s=0.707): (1*1 + 0.707*0) / 1.707
        (2, [1.0, 0.0], 1 / (1 + np.sqrt(0.5))),
        (1, [1.0, 0.0], 1.0),
        # p2 (s=1), p1 (s=0.707), p0 (s=0 < threshold, ignored)
        (3, [0.0, 1.0], (0.5 + np.sqrt(0.5) * 0.0) / (1 + np.sqrt(0.5))),
    ],
    ids=["top-2-weighted", "top-1", "below-threshold-neighbour-ignored"],
)
def test_q_hat_is_the_similarity_weighted_mean_of_the_top_k(
    top_k: int, query: list[float], expected_a: float
) -> None:
    store = tiny_store(top_k=top_k, min_similarity=0.3)
    assert store.predict(np.array(query), "a") == pytest.approx(expected_a)


@needs_cema
def test_q_hat_falls_back_to_the_models_profiled_mean() -> None:
    store = tiny_store(min_similarity=0.3)
    away = np.array([-1.0, 0.0])  # no profiled prompt within the threshold
    assert store.neighbours(away)[1].tolist() == []
    assert store.predict(away, "a") == pytest.approx(0.5)  # (1 + 0 + 0.5) / 3
    assert store.predict(away, "b") == pytest.approx(0.5)
    # the workload row w0 sits on p0 but is never a neighbour (scores 0 there)
    assert store.workload_ids() == store.workload_ids("f") == ["w0"]
    assert store.workload_ids("g") == []
    assert store.predict(store.embedding("w0"), "a") > 0.5
    with pytest.raises(ConfigError, match="no `profile` prompts"):
        QualityStore(
            ids=["w0"],
            families=["f"],
            splits=["workload"],
            models=["a"],
            embeddings=np.ones((1, 2), dtype=np.float32),
            scores=np.ones((1, 1), dtype=np.float32),
        )


@needs_cema
def test_store_predictor_maps_models_and_classes() -> None:
    ctx = paper_testbed()
    pred = StoreQualityPredictor(ctx, tiny_store(), {"lm1": "a", "lm2": "b"}, {TG: "f"})
    assert pred.predict(TG, "worker-1", "lm1") == pytest.approx(0.5)  # family f: 1, 0
    assert pred.predict("g", "worker-1", "lm1") == pytest.approx(0.5)  # family g: 0.5
    assert pred.predict(TG, "worker-1", "lm3") == 1.0  # not in the store: its prior
    with pytest.raises(ConfigError, match="nope not in the quality store"):
        StoreQualityPredictor(ctx, tiny_store(), {"lm1": "nope"})


@needs_cema
def test_cema_with_a_missing_store_is_a_config_error(tmp_path: Any) -> None:
    with pytest.raises(ConfigError, match="build-store"):
        build(paper_testbed(), 0, {"predictor": "store", "store": {"path": str(tmp_path)}})
    router = build(
        paper_testbed(), 0, {"predictor": "store", "store": {"models": {"lm1": "latent-70b"}}}
    )
    assert STORE_FILE.exists()
    assert router.predictor.predict("arithmetic", "worker-1", "lm1") == pytest.approx(
        QualityStore.load().model_mean("latent-70b", "arithmetic")
    )


# -- the online window -------------------------------------------------------


def _records(outcomes: list[str], lm: str = "lm1", dest: str = "worker-3") -> list[RequestRecord]:
    return [
        RequestRecord(
            id=str(k),
            lm=lm,
            origin="worker-1",
            destination=dest,
            prompts=1,
            slot=0,
            submit_s=0,
            outcome=outcome,  # type: ignore[arg-type]
        )
        for k, outcome in enumerate(outcomes)
    ]


@needs_cema
def test_rag_recovers_after_timeouts_with_a_bounded_window() -> None:
    pred = RagQualityPredictor(paper_testbed(), embed=hashed)
    pred.observe(_records(["timeout"] * 1100))
    assert pred.predict("lm1", "worker-3", "lm1") == 0.0
    pred.observe(_records(["success"] * 3000))
    # the window keeps the newest 4,096: 3,000 successes and 1,096 timeouts
    assert pred.predict("lm1", "worker-3", "lm1") == pytest.approx(0.73, abs=0.01)
    assert pred.predict("lm1", "worker-3", "lm1") == pytest.approx(3000 / 4096)
    assert pred.index.ntotal == 1  # one row per class, not per request
    assert all(len(w[0]) <= pred.history for w in pred.windows.values())


@needs_cema
def test_rag_keeps_moving_past_a_thousand_records() -> None:
    pred = RagQualityPredictor(paper_testbed(), embed=hashed, history=4096)
    pred.observe(_records(["success"] * 1000))
    before = pred.predict("lm1", "worker-3", "lm1")
    pred.observe(_records(["timeout"] * 500))
    after = pred.predict("lm1", "worker-3", "lm1")
    assert before == 1.0
    assert after == pytest.approx(1000 / 1500)
    small = RagQualityPredictor(paper_testbed(), embed=hashed, history=100)
    small.observe(_records(["timeout"] * 1100 + ["success"] * 3000))
    assert small.predict("lm1", "worker-3", "lm1") == 1.0  # only the newest 100 count


# -- UniRoute ----------------------------------------------------------------


def test_kmeans_is_deterministic_and_separates_clear_clusters() -> None:
    rng = np.random.default_rng(0)
    points = np.vstack([rng.normal(0, 0.05, (20, 2)), rng.normal(5, 0.05, (20, 2))])
    c1, a1 = kmeans(points, 2, 10, seed=7)
    c2, a2 = kmeans(points, 2, 10, seed=7)
    assert np.array_equal(c1, c2) and np.array_equal(a1, a2)
    assert len(set(a1[:20].tolist())) == 1 and len(set(a1[20:].tolist())) == 1
    assert a1[0] != a1[-1]


def priced(price: dict[str, float]) -> ClusterContext:
    base = paper_testbed()
    nodes = [
        NodeInfo(
            name=n.name,
            spec=n.spec.model_copy(
                update={"power": PowerProfile(cost_per_hour=price.get(n.name, 1.0))}
            ),
        )
        for n in base.nodes
    ]
    return ClusterContext(nodes=nodes, services=base.services)


def uniroute(ctx: ClusterContext, models: dict[str, str], **kw: Any) -> UniRouter:
    params = UniRouteParams.model_validate(
        {"clusters": 2, "store": {"models": models, "classes": {TG: "f"}}, **kw}
    )
    return UniRouter(ctx, 0, params, tiny_store())


@needs_cema
@pytest.mark.parametrize(
    ("models", "cost_weight", "want_model"),
    [
        ({"lm1": "a", "lm2": "b"}, 0.05, "lm1"),
        ({"lm1": "b", "lm2": "a"}, 0.05, "lm2"),
        ({"lm1": "a", "lm2": "a"}, 0.05, "cheapest"),
        ({"lm1": "b", "lm2": "a"}, 100.0, "cheapest"),
    ],
    ids=["better-model", "better-model-swapped", "tie-cheapest", "cost-dominates"],
)
def test_uniroute_picks_least_error_plus_normalized_cost(
    models: dict[str, str], cost_weight: float, want_model: str
) -> None:
    ctx = priced({"worker-1": 0.1, "worker-2": 5.0})
    router = uniroute(ctx, models, cost_weight=cost_weight)
    # family f's prompts p0 (a: 1, b: 0) and p1 (a: 0, b: 1) fall in two clusters
    assert {round(router.error(TG, lm), 6) for lm in ("lm1", "lm2")} <= {0.5}
    router.errors = np.array([[0.1, 0.4], [0.1, 0.4]])  # a is the better model everywhere
    router._class_errors.clear()
    obs = slot_obs([("worker-3", TG, 4)], ctx=ctx)
    decision = router.route(obs)
    (route,) = decision.value.routes
    model = route.model or route.lm
    from lmedge.policies.cema.evaluator import BatchEvaluator, Weights

    ev = BatchEvaluator(obs, router.quality, Weights(0.25, 0.25, 0.25, 0.25), 2.0)
    cost = unit_cost(ev)
    legal = ev.legal[0].tolist()
    chosen = ev.dests.index((route.destination, model))
    if want_model == "cheapest":
        assert cost[chosen] == min(cost[d] for d in legal)
    else:
        assert model == want_model
        same_model = [d for d in legal if ev.dests[d][1] == model]
        assert cost[chosen] == min(cost[d] for d in same_model)
    assert router.last_fitness is not None and 0.0 <= router.last_fitness <= 1.0
