"""The per-site MILP (sites.py): a feasible, consistent plan for every node, in bounded time."""

from __future__ import annotations

from pathlib import Path

import pytest

from lmedge.api import (
    ClusterContext,
    NodeObservation,
    SlotObservation,
    check_placement,
    check_routing_map,
)
from lmedge.bench.runner import emulated_backend
from lmedge.bench.scale import scale_scenario
from lmedge.policies.milp import build_deployer, build_router
from lmedge.sim import load_scenario
from tests.unit.policies.lyapunov.scenario import paper_testbed


def _slot(tmp_path: Path) -> tuple[ClusterContext, SlotObservation]:
    """A real slot of a 24-worker, 3-site cluster with the 16 LMs of the scale scenarios."""
    backend = emulated_backend(load_scenario(scale_scenario(tmp_path, 24, sites=3)), 1)
    ctx = backend.context()
    obs = SlotObservation(
        slot=0,
        epoch=0,
        context=ctx,
        macro=None,
        snapshot=backend.snapshot(0),
        arrivals=backend.arrivals(0),
    )
    return ctx, obs


def _placements(ctx: ClusterContext, obs: SlotObservation, deployer: object) -> dict:
    states = {s.name: s for s in obs.snapshot.nodes}
    out = {}
    for n in ctx.workers:
        nobs = NodeObservation(
            slot=obs.slot,
            epoch=0,
            node=n,
            services=ctx.services,
            roles=[],
            state=states[n.name],
            tau_s=ctx.loop.tau_s,
            slot_s=ctx.loop.slot_s,
        )
        d = deployer.place(nobs)  # type: ignore[attr-defined]
        assert check_placement(d.value, n, ctx.services) == [], n.name
        out[n.name] = d
    return out


@pytest.mark.parametrize(
    ("limit_s", "source"), [(60.0, "rule"), (1e-6, "fallback")], ids=["solved", "no-incumbent"]
)
def test_every_node_gets_a_feasible_plan_and_each_batch_stays_in_its_site(
    tmp_path: Path, limit_s: float, source: str
) -> None:
    ctx, obs = _slot(tmp_path)
    params = {"decompose_above": 1, "site_budget_s": limit_s, "mip_gap": 0.2, "sites_per_slot": 3}
    router = build_router(ctx, 0, params)
    deployer = build_deployer(ctx, 0, {}, router)
    decision = router.route(obs)
    assert router.split is not None and len(router.split.contexts) == 3
    assert check_routing_map(decision.value, ctx, obs.arrivals) == []
    sol = router.plan.last
    assert sol is not None and "per site: 3 sites" in sol.status
    assert decision.source == source
    placements = _placements(ctx, obs, deployer)
    assert set(sol.placements) == {n.name for n in ctx.workers}  # no node left without a plan
    assert sol.destinations, "the sites route their batches"
    for (origin, lm), dest in sol.destinations.items():
        assert ctx.node(dest).spec.site == ctx.node(origin).spec.site
        # u <= y: the destination hosts the LM it receives, in the plan its deployer returns
        assert placements[dest].value.by_lm()[lm].mode != "off", (origin, lm, dest)
    assert sol.solved_sites == tuple(router.split.contexts)  # 3 sites, 3 a slot: all
    if source == "rule":
        assert sol.source == "milp" and sol.gap is not None and sol.gap >= 0
        assert sol.objective is not None and sol.start_objective is not None
        assert sol.objective <= sol.start_objective + 1e-9
    else:  # no time to improve: each site keeps the greedy plan HiGHS started from
        assert sol.source == "greedy" and "3 greedy plan" in sol.status
        assert sol.objective == sol.start_objective
        assert all(d.source == "fallback" for d in placements.values())


def test_highs_takes_the_sites_in_turn_and_the_rest_keep_their_greedy_plan(
    tmp_path: Path,
) -> None:
    """One site a slot, round robin: every slot plans every node, and in three slots
    each of the three sites is given to HiGHS once."""
    ctx, obs = _slot(tmp_path)
    router = build_router(ctx, 0, {"decompose_above": 1, "sites_per_slot": 1})
    assert router.split is not None
    turns = []
    for slot in range(4):
        router.route(obs.model_copy(update={"slot": slot}))
        sol = router.plan.last
        assert sol is not None and set(sol.placements) == {n.name for n in ctx.workers}
        assert "1 given to HiGHS" in sol.status and sol.gap is None  # two sites have no bound
        turns.append(sol.solved_sites)
    names = list(router.split.contexts)
    assert turns == [(names[0],), (names[1],), (names[2],), (names[0],)]


def test_small_clusters_keep_the_joint_model() -> None:
    assert build_router(paper_testbed(), 0, {}).split is None  # 6 workers


def test_a_single_site_cluster_is_never_split(tmp_path: Path) -> None:
    backend = emulated_backend(load_scenario(scale_scenario(tmp_path, 12, sites=1)), 1)
    assert build_router(backend.context(), 0, {"decompose_above": 1}).split is None
