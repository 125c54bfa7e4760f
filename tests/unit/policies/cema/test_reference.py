"""The compiled CEMA search gives the plain-Python search's routes, fitness and random state.

`reference.py` is the dictionary-based evaluator and search the kernel
replaced. Same seed, same slot: the same chromosome, the same fitness to the
bit, and the router's `random.Random` left where the reference leaves it, slot
after slot, so every figure measured with the Python search still holds.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from lmedge.api import ClusterContext, NodeInfo, PowerProfile, ServiceInfo, SiteLink
from lmedge.api.manifests import load_resources
from lmedge.bench.runner import resolve_scenario
from lmedge.bench.scale import scale_scenario
from lmedge.policies.cema import BatchEvaluator, CemaRouter, build
from lmedge.policies.kit.estimates import transfer_s
from tests.unit.policies.cema.reference import ReferenceEvaluator, ReferenceSearch
from tests.unit.policies.lyapunov.scenario import paper_testbed, slot_obs

SMALL = {"population": 6, "generations": 4}  # the reference is slow past a few hundred genes


def _context(path: Path) -> ClusterContext:
    nodes, _ = load_resources(path / "nodes.yaml")
    _, services = load_resources(path / "services.yaml")
    return ClusterContext(nodes=nodes, services=services)


def mixed_links() -> ClusterContext:
    """The testbed with links that differ node by node, prices, powers and quality priors.

    worker-1 declares its own link to wtc and none to mshed (mshed's nodes
    then decide, differently); worker-3 declares none at all, so the
    receivers' links or the default apply; worker-4, in worker-3's site,
    declares a slow link to uob.
    """
    base = paper_testbed()
    links = {
        "worker-1": [SiteLink(site="wtc", bandwidth_mbps=200, latency_ms=7)],
        "worker-3": [],
        "worker-4": [SiteLink(site="uob", bandwidth_mbps=50, latency_ms=20)],
        "worker-6": [SiteLink(site="uob", bandwidth_mbps=80, latency_ms=11)],
    }
    nodes = []
    for k, n in enumerate(base.nodes):
        update: dict[str, Any] = {
            "power": PowerProfile(
                cost_per_hour=0.05 * k, busy_watts_per_gpu=150 + 10 * k, busy_watts_per_core=3 + k
            )
        }
        if n.name in links:
            update["links"] = links[n.name]
        nodes.append(NodeInfo(name=n.name, spec=n.spec.model_copy(update=update)))
    services = [
        ServiceInfo(name=s.name, spec=s.spec.model_copy(update={"quality": 0.6 + 0.1 * k}))
        for k, s in enumerate(base.services)
    ]
    return ClusterContext(nodes=nodes, services=services)


def random_slot(ctx: ClusterContext, rng: random.Random, pairs: int, odd: bool) -> Any:
    """Backlogs, running instances (some on CPU), and `pairs` (origin, class) batches.

    `odd` adds an origin the context does not know and drops one node from
    the snapshot.
    """
    workers = [n.name for n in ctx.workers]
    lms, classes = ctx.lm_names, ctx.request_classes
    backlog = {n: {lm: rng.choice([0, 0, 1, 3, 8]) for lm in lms} for n in workers}
    running = {
        n: {
            lm: rng.choice(["gpu", "cpu"]) if ctx.service(lm).spec.runs_on != "gpu-only" else "gpu"
            for lm in rng.sample(lms, 2)
            if n in ctx.feasible_nodes(lm)
        }
        for n in rng.sample(workers, len(workers) // 2)
    }
    origins = [n.name for n in ctx.nodes] + (["gateway-x"] if odd else [])
    chosen = set()
    while len(chosen) < pairs:
        chosen.add((rng.choice(origins), rng.choice(classes)))
    arrivals = [(o, c, rng.randint(1, 9)) for o, c in sorted(chosen)]
    obs = slot_obs(arrivals, backlog, running, ctx=ctx)
    if odd:
        kept = [s for s in obs.snapshot.nodes if s.name != workers[-1]]
        obs = obs.model_copy(update={"snapshot": obs.snapshot.model_copy(update={"nodes": kept})})
    return obs


def _scenario(name: str, tmp_path: Path) -> ClusterContext:
    if name == "mixed-links":
        return mixed_links()
    if name == "scale-60":
        return _context(scale_scenario(tmp_path, 60, sites=5))
    return _context(resolve_scenario(name))


@pytest.mark.parametrize(
    ("scenario", "pairs", "params"),
    [
        ("testbed", 5, {}),  # fewer than 21 genes: `sample` draws from a pool
        ("testbed", 20, {}),
        ("mixed-links", 8, {"w_cost": 0.3, "w_energy": 0.2, "w_quality": 0.2, "w_time": 0.3}),
        ("mixed-links", 24, {"repair_budget": 1, "elite": 0}),
        ("model-routing", 12, {}),
        ("testbed", 20, {"search_budget": 1500}),  # 2 generations of 30 x 20 genes
        ("large", 40, SMALL),
        ("scale-60", 60, SMALL),
    ],
)
def test_routes_fitness_and_random_state_equal_the_python_search(
    tmp_path: Path, scenario: str, pairs: int, params: dict[str, Any]
) -> None:
    ctx = _scenario(scenario, tmp_path)
    rng = random.Random(f"{scenario}-{pairs}")
    router = build(ctx, 3, params)
    assert isinstance(router, CemaRouter)
    search = ReferenceSearch(router.p, random.Random())
    search.rng.setstate(router.rng.getstate())
    destinations = set()
    for slot in range(3):  # the generator carries over from slot to slot
        obs = random_slot(ctx, rng, pairs, odd=slot == 1)
        ref = ReferenceEvaluator(obs, router.predictor, router.weights, router.p.radio_watts)
        search.p = router.p.model_copy(update={"generations": router.generations(len(ref.genes))})
        best = search.search(ref)
        routes = router.route(obs).value.routes
        got = [(r.destination, r.model or r.lm) for r in routes]
        assert got == [ref.dests[d] for d in best]
        assert router.last_fitness == ref.fitness(best)
        assert router.rng.getstate() == search.rng.getstate()
        destinations |= {r.destination for r in routes}
    assert len(destinations) > 1  # not a degenerate search that sends everything to one place


@pytest.mark.parametrize("scenario", ["testbed", "mixed-links", "model-routing"])
def test_terms_and_bounds_equal_the_python_evaluator(tmp_path: Path, scenario: str) -> None:
    ctx = _scenario(scenario, tmp_path)
    rng = random.Random(scenario)
    router = build(ctx, 0, {})
    obs = random_slot(ctx, rng, 16, odd=True)
    ev = BatchEvaluator(obs, router.predictor, router.weights, 2.0)
    ref = ReferenceEvaluator(obs, router.predictor, router.weights, 2.0)
    assert (ev.q_ub, ev.c_ub, ev.e_ub, ev.t_ub) == (ref.q_ub, ref.c_ub, ref.e_ub, ref.t_ub)
    assert ev.c_ub > 0 or scenario != "mixed-links"  # priced nodes: the cost term is live
    assert CemaRouter.load_aware(ev) == [
        ev.dests.index(ref.dests[d]) for d in ReferenceSearch.load_aware(ref)
    ]
    for _ in range(40):
        pick = [rng.randrange(len(legal)) for legal in ref.legal]
        theirs = [legal[k] for legal, k in zip(ref.legal, pick, strict=True)]
        ours = [ev.dests.index(ref.dests[d]) for d in theirs]
        assert ev.raw(ours) == ref.raw(theirs)
        assert ev.fitness(ours) == ref.fitness(theirs)


def test_every_transfer_follows_the_links_node_by_node() -> None:
    """Each (origin, destination) transfer term is `transfer_s`, links declared node by node."""
    ctx = mixed_links()
    origins = [n.name for n in ctx.nodes] + ["gateway-x"]
    obs = slot_obs([(o, lm, 3) for o in origins for lm in ctx.lm_names], ctx=ctx)
    router = build(ctx, 0, {})
    ev = BatchEvaluator(obs, router.predictor, router.weights, 2.0)
    values = set()
    for g, legal in enumerate(ev.legal):
        gene = ev.genes[g]
        for d in legal.tolist():
            node, model = ev.dests[d]
            expected = transfer_s(ctx, gene.origin, node, model, gene.prompts)
            assert ev.transfer(g, d) == expected, (gene, node)
            values.add(expected)
    assert len(values) > 5  # intra-site, own, the receiver's and the default links differ


def test_the_search_budget_cuts_generations_only_past_it() -> None:
    router = build(paper_testbed(), 0, {})
    assert isinstance(router, CemaRouter)
    assert router.generations(24) == 20  # the paper's testbed: 30 x 20 x 24 genes, far below
    assert router.generations(1_666) == 20
    assert router.generations(10_000) == 3  # 1,000,000 // (30 x 10,000)
    assert router.generations(10**7) == 1  # always at least one
    unbounded = build(paper_testbed(), 0, {"search_budget": None})
    assert isinstance(unbounded, CemaRouter) and unbounded.generations(10**7) == 20
