"""CEMA's request mode: the catalogue's terms, the evaluator's model and every routing method.

A controlled batch (no emulator): R requests over a catalogue of cloud and
edge destinations, routed by each method and scored by the one evaluator.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import numpy as np
import pytest

from lmedge.api import (
    LMPlacement,
    Placement,
    PowerProfile,
    RequestWindow,
    WindowRequest,
    capabilities_of,
)
from lmedge.backends.emulated import EmulatedBackend, load_scenario
from lmedge.policies.cema import build
from lmedge.policies.cema import router as cema_router
from lmedge.policies.cema.catalogue import KIB_PER_GIB, Destination, from_context
from lmedge.policies.cema.evaluator import Weights
from lmedge.policies.cema.requests import (
    METHODS,
    Batch,
    Monitor,
    Request,
    RequestEvaluator,
    RoutingState,
    compare,
    controlled_batch,
    route_batch,
)

EQUAL = Weights(0.25, 0.25, 0.25, 0.25)


def catalogue() -> list[Destination]:
    cloud = dict(
        tier="cloud",
        input_price_per_1k=0.5,
        output_price_per_1k=1.5,
        single_tokens_per_s=80.0,
        batch_tokens_per_s=2000.0,
        watts=400.0,
        latency_s=0.05,
    )
    edge = dict(
        tier="edge", single_tokens_per_s=25.0, batch_tokens_per_s=300.0, watts=60.0, latency_s=0.005
    )
    return [
        Destination(node=f"n{k}", model=f"m{k}", **(cloud if k < 2 else edge))  # type: ignore[arg-type]
        for k in range(5)
    ]


def batch(r: int = 20, seed: int = 1) -> Batch:
    rng = np.random.default_rng(seed)
    reqs = [
        Request(str(i), "c", int(rng.integers(20, 400)), int(rng.integers(50, 500)))
        for i in range(r)
    ]
    dests = catalogue()
    skill = np.array([0.9 if d.tier == "cloud" else 0.6 for d in dests])
    quality = np.clip(skill[None, :] + rng.normal(0, 0.1, (r, len(dests))), 0, 1)
    return controlled_batch(reqs, dests, quality, backlog=np.array([0.0, 5.0, 0.0, 1.0, 2.0]))


@pytest.mark.parametrize(
    ("dest", "tokens", "busy", "alone"),
    [
        (
            Destination(
                "n", "m", prefill_tokens_per_s=1000, single_tokens_per_s=20, batch_tokens_per_s=400
            ),
            (500, 200),
            0.5 + 0.5,
            0.5 + 10.0,
        ),
        (Destination("n", "m", seconds_per_prompt=1.5), (500, 200), 3.0, 3.0),
    ],
    ids=["token-engine", "pipeline-two-prompts"],
)
def test_service_shares_the_saturated_rate_and_alone_is_the_single_rate(
    dest: Destination, tokens: tuple[int, int], busy: float, alone: float
) -> None:
    assert dest.service(*tokens, prompts=2) == pytest.approx((busy, alone))


def test_cost_is_token_prices_plus_metered_transfer_and_energy_is_power_times_utilization() -> None:
    d = Destination(
        "n",
        "m",
        input_price_per_1k=2.0,
        output_price_per_1k=6.0,
        transfer_price_per_gib=0.1,
        watts=300.0,
        utilization=0.5,
    )
    assert d.cost(1000, 500, KIB_PER_GIB) == pytest.approx(2.0 + 3.0 + 0.1)
    assert Destination("n", "m").cost(1000, 500, 100.0) == 0.0  # self-hosted
    assert d.energy(2.0) == pytest.approx(300.0)


def test_the_makespan_is_the_continuous_batching_model() -> None:
    b = batch(8)
    ev = RequestEvaluator(b, EQUAL, radio_watts=2.0)
    assignment = [i % 3 for i in range(8)]
    finish = b.backlog.copy()
    for i, d in enumerate(assignment):
        finish[d] += ev.busy[i, d]
    expected = max(
        b.net[i, d] + max(finish[d], b.backlog[d] + ev.alone[i, d])
        for i, d in enumerate(assignment)
    )
    q, c, e, t = ev.raw(assignment)
    assert t == pytest.approx(expected)
    assert e == pytest.approx(
        sum(b.dests[d].energy(ev.busy[i, d]) + 2.0 * b.net[i, d] for i, d in enumerate(assignment))
    )
    assert q == pytest.approx(
        float(np.mean([1 - b.quality[i, d] for i, d in enumerate(assignment)]))
    )
    assert c == pytest.approx(
        sum(
            b.dests[d].cost(r.input_tokens, r.output_tokens, r.kib)
            for r, d in zip(b.requests, assignment, strict=True)
        )
    )


def test_time_is_normalized_by_the_seed_makespan() -> None:
    ev = RequestEvaluator(batch(), EQUAL, radio_watts=2.0)
    seed = ev.seed.tolist()
    assert ev.bounds[3] == pytest.approx(ev.raw(seed)[3])


@pytest.mark.parametrize("method", METHODS)
def test_every_method_routes_each_request_to_a_legal_destination(method: str) -> None:
    b = batch()
    b.legal[0, :] = False
    b.legal[0, 3] = True  # request 0 has one destination
    out = route_batch(b, method, state=RoutingState(random.Random(3)))
    assert len(out.assignment) == len(b.requests)
    assert all(b.legal[i, d] for i, d in enumerate(out.assignment))
    assert out.assignment[0] == 3
    assert out.decision_s >= 0
    if method in ("cloud-only", "edge-only"):
        tier = method.removesuffix("-only")
        assert all(b.dests[d].tier == tier for d in out.assignment[1:])


def test_cema_never_ends_above_its_seed() -> None:
    for seed in range(3):
        out = route_batch(batch(seed=seed), "cema", state=RoutingState(random.Random(seed)))
        assert out.j <= out.seed_j + 1e-12


def test_round_robin_cycles_over_destinations_across_windows() -> None:
    st = RoutingState()
    first = route_batch(batch(3), "round-robin", state=st).assignment
    second = route_batch(batch(3), "round-robin", state=st).assignment
    assert first + second == [0, 1, 2, 3, 4, 0]


def test_independent_routing_crowds_what_the_joint_term_spreads() -> None:
    """Two equal destinations but one's backlog: independently every request takes
    the idle one; the seed (earliest finish with this window's work) spreads them."""
    d = Destination("a", "m", single_tokens_per_s=100, batch_tokens_per_s=100)
    dests = [d, Destination("b", "m", single_tokens_per_s=100, batch_tokens_per_s=100)]
    reqs = [Request(str(i), "c", 0, 300) for i in range(6)]
    b = controlled_batch(reqs, dests, np.full((6, 2), 0.8), backlog=np.array([0.0, 2.0]))
    independent = route_batch(b, "independent")
    seed = route_batch(b, "seed")
    assert set(independent.assignment) == {0}
    assert set(seed.assignment) == {0, 1}
    assert seed.makespan < independent.makespan


def test_the_monitor_drains_one_second_per_second() -> None:
    pairs = [("n1", "m"), ("n2", "m")]
    mon = Monitor()
    mon.dispatch(10.0, pairs, [3.0, 0.5])
    assert mon.backlog(11.0, pairs).tolist() == [2.0, 0.0]
    mon.dispatch(11.0, pairs[:1], [1.0])
    assert mon.backlog(11.0, pairs).tolist() == [3.0, 0.0]


def test_an_unknown_method_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="unknown method 'greedy'"):
        route_batch(batch(2), "greedy")


def model_routing() -> EmulatedBackend:
    be = EmulatedBackend(load_scenario(Path("examples/model-routing")), seed=1)
    res = be.apply_placement(
        Placement(node="worker-2", lms=[LMPlacement(lm="lm2", mode="gpu", cpu_cores=4, vgpus=1)])
    )
    assert not res.errors
    return be


def window(be: EmulatedBackend, n: int) -> RequestWindow:
    return RequestWindow(
        slot=0,
        start_s=0.0,
        end_s=1.0,
        context=be.context(),
        snapshot=be.snapshot(0),
        requests=[
            WindowRequest(
                id=str(i), origin="worker-1", lm="text-generation", prompts=2, submit_s=0.5
            )
            for i in range(n)
        ],
    )


def test_request_mode_routes_each_request_over_the_hosted_pairs() -> None:
    be = model_routing()
    router = build(be.context(), 1, {"mode": "request"})
    assert capabilities_of(router).routes_requests
    routes = router.route_requests(window(be, 5))
    assert [(r.destination, r.serving_lm) for r in routes] == [("worker-2", "lm2")] * 5
    assert router.last_window is not None and len(router.last_window.assignment) == 5
    # the monitor now holds the window's work at that destination
    assert router.monitor.backlog(1.0, [("worker-2", "lm2")])[0] > 0


def test_request_mode_falls_back_to_the_seed_when_the_method_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = cema_router.route_batch
    methods: list[str] = []

    def failing(batch: Batch, method: str, *args: object) -> object:
        methods.append(method)
        if method != "seed":
            raise RuntimeError("search failed")
        return real(batch, method, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(cema_router, "route_batch", failing)
    be = model_routing()
    router = build(be.context(), 1, {"mode": "request"})
    assert len(router.route_requests(window(be, 3))) == 3
    assert methods == ["cema", "seed"]


def test_the_catalogue_reads_throughput_from_the_token_profile_and_prices_from_the_node(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "llm-edge"
    shutil.copytree(Path("examples/llm-edge"), folder)
    nodes = (folder / "nodes.yaml").read_text()
    priced = nodes.replace(
        "  name: rtx4090-a\nspec:\n",
        "  name: rtx4090-a\nspec:\n  tier: cloud\n"
        "  power: {inputPricePer1K: 0.1, outputPricePer1K: 0.3, utilization: 0.5}\n",
    )
    assert priced != nodes
    (folder / "nodes.yaml").write_text(priced)
    ctx = load_scenario(folder).context()
    model = next(m for m in ctx.lm_names if ctx.can_host("rtx4090-a", m))
    tokens = ctx.service(model).spec.engine.tokens
    assert tokens is not None
    prof = next(g for g in tokens.gpus if g.gpu_model == "NVIDIA-RTX-4090")
    (d,) = from_context(ctx, [("rtx4090-a", model)])
    assert (d.tier, d.input_price_per_1k, d.output_price_per_1k) == ("cloud", 0.1, 0.3)
    assert d.single_tokens_per_s == prof.decode_tokens_per_s(1)
    assert d.batch_tokens_per_s == prof.decode_tokens_per_s(tokens.max_running_sequences)
    assert d.prefill_tokens_per_s == prof.prefill_tokens_per_s
    assert d.seconds_per_prompt is None
    assert d.watts * d.utilization == PowerProfile().busy_watts_per_gpu * 0.5


def test_compare_runs_every_batch_through_every_method() -> None:
    batches = [batch(10, seed=s) for s in range(3)]
    out = compare(batches, ["cema", "seed", "round-robin"], seed=2)
    assert {m: len(v) for m, v in out.items()} == {"cema": 3, "seed": 3, "round-robin": 3}
    for cema, seed in zip(out["cema"], out["seed"], strict=True):
        assert cema.seed_j == pytest.approx(seed.j)  # one evaluator scores both
        assert cema.j <= seed.j + 1e-12
    # round robin's position runs on from batch to batch
    assert out["round-robin"][1].assignment[0] == (out["round-robin"][0].assignment[-1] + 1) % 5
