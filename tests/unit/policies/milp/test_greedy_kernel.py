"""The compiled greedy plan (kernel.py) equals the Python one it replaced, to the bit."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from lmedge.api import Arrival, ClusterContext, NodeInfo, SiteLink, SlotObservation
from lmedge.bench.runner import emulated_backend
from lmedge.bench.scale import scale_scenario
from lmedge.policies.milp.greedy import greedy_slot
from lmedge.policies.milp.sites import SiteSplit
from lmedge.sim import load_scenario
from tests.unit.policies.lyapunov.scenario import paper_testbed, slot_obs
from tests.unit.policies.milp.reference_greedy import reference_greedy


def _same(obs: SlotObservation, cpu_modes: bool) -> None:
    dest, placements = greedy_slot(obs, cpu_modes)
    want_dest, want_placements = reference_greedy(obs, cpu_modes)
    assert dest == want_dest
    assert {n: p.model_dump() for n, p in placements.items()} == {
        n: p.model_dump() for n, p in want_placements.items()
    }


def _random_slot(ctx: ClusterContext, rng: random.Random) -> SlotObservation:
    names = [n.name for n in ctx.workers]
    arrivals = [
        (origin, lm, rng.randint(1, 40))
        for origin in [*names, "not-a-node"]
        for lm in ctx.lm_names
        if rng.random() < 0.6
    ]
    backlog = {n: {lm: rng.randint(0, 30) for lm in ctx.lm_names} for n in names}
    modes = ("gpu", "cpu")
    running = {
        n: {lm: rng.choice(modes) for lm in ctx.lm_names if rng.random() < 0.2} for n in names
    }
    return slot_obs(arrivals, backlog, running, ctx=ctx)


def slow_links(rng: random.Random) -> ClusterContext:
    """The testbed with links of seconds, node by node: transfer decides where batches go.

    Every node its own intra-site link; some declare links to other sites,
    some none (the receiver's or the default link applies).
    """
    base = paper_testbed()
    sites = sorted({n.spec.site for n in base.nodes})
    nodes = []
    for n in base.nodes:
        update: dict[str, Any] = {
            "intra_site_latency_ms": rng.uniform(50, 3000),
            "intra_site_bandwidth_mbps": rng.uniform(0.5, 20),
            "links": [
                SiteLink(
                    site=s, bandwidth_mbps=rng.uniform(0.5, 20), latency_ms=rng.uniform(50, 3000)
                )
                for s in sites
                if s != n.spec.site and rng.random() < 0.5
            ],
        }
        nodes.append(NodeInfo(name=n.name, spec=n.spec.model_copy(update=update)))
    return ClusterContext(nodes=nodes, services=base.services)


@pytest.mark.parametrize("cpu_modes", [False, True], ids=["gpu-only", "cpu-modes"])
@pytest.mark.parametrize("seed", range(4))
def test_testbed_slots_get_the_reference_plan(seed: int, cpu_modes: bool) -> None:
    _same(_random_slot(paper_testbed(), random.Random(seed)), cpu_modes)


@pytest.mark.parametrize("cpu_modes", [False, True], ids=["gpu-only", "cpu-modes"])
@pytest.mark.parametrize("seed", range(4))
def test_slow_links_node_by_node_get_the_reference_plan(seed: int, cpu_modes: bool) -> None:
    rng = random.Random(seed)
    obs = _random_slot(slow_links(rng), rng)
    _same(obs, cpu_modes)
    # the links matter here: not every batch is served where it arrives
    dest, _ = greedy_slot(obs, cpu_modes)
    assert any(o != n for (o, _), n in dest.items() if o != "not-a-node")


def test_a_slot_with_nothing_arriving_keeps_what_runs() -> None:
    obs = slot_obs([], {"worker-5": {"lm4": 30}}, {"worker-5": {"lm4": "gpu"}})
    _same(obs, False)
    _, placements = greedy_slot(obs, False)
    assert placements["worker-5"].by_lm()["lm4"].mode == "gpu"


@pytest.mark.parametrize("cpu_modes", [False, True], ids=["gpu-only", "cpu-modes"])
def test_the_sites_of_a_scale_cluster_get_the_reference_plan(
    tmp_path: Path, cpu_modes: bool
) -> None:
    """Real slots of a 60-worker, 4-site cluster (16 LMs, declared cross-site links),
    whole and site by site, as the per-site MILP calls it."""
    backend = emulated_backend(load_scenario(scale_scenario(tmp_path, 60, sites=4)), 1)
    ctx = backend.context()
    split = SiteSplit.of(ctx)
    for slot in range(3):
        obs = SlotObservation(
            slot=slot,
            epoch=0,
            context=ctx,
            macro=None,
            snapshot=backend.snapshot(slot),
            arrivals=[
                *backend.arrivals(slot),
                Arrival(origin="elsewhere", lm=ctx.lm_names[0], requests=2, prompts=3),
            ],
        )
        _same(obs, cpu_modes)
        for sub_ctx in split.contexts.values():
            _same(obs.model_copy(update={"context": sub_ctx}), cpu_modes)
