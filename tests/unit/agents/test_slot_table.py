"""The array-priced rule routing chooses exactly what ranking `candidates()` chooses."""

from __future__ import annotations

from pathlib import Path

import pytest

from lmedge.agents.rules.scheduler import LAST_RESORT, Plan, candidates, rule_routing
from lmedge.api import Arrival, ClusterContext, MacroPolicy, NodeState, Rejection, Route, RoutingMap
from lmedge.bench.runner import emulated_backend, resolve_scenario
from lmedge.controller.assembly import PolicyChoice, build_plugins
from lmedge.controller.loop import ControlLoop
from lmedge.sim import load_scenario


def reference_routing(
    ctx: ClusterContext,
    macro: MacroPolicy | None,
    states: dict[str, NodeState],
    arrivals: list[Arrival],
    admit_fraction: float | None,
) -> RoutingMap:
    """The rule as it was written before slot_table.py: `candidates()` per pair."""
    extra: dict[tuple[str, str], int] = {}
    routes, rejections = [], []
    plan = Plan.of(ctx, macro)
    sign = 1 if admit_fraction is not None else -1
    for a in sorted(arrivals, key=lambda x: (sign * x.prompts, x.origin, x.lm)):
        if a.requests <= 0 or not ctx.has_service(a.lm):
            continue
        ranked = candidates(ctx, macro, states, a.lm, extra, max(1, a.prompts), a.origin, plan)
        if not ranked:
            continue
        usable = (
            [c for c in ranked if c.status not in LAST_RESORT]
            or [c for c in ranked if c.status == "draining"]
            or ranked
        )
        best = usable[0]
        horizon = None if admit_fraction is None else admit_fraction * ctx.deadline_s(a.lm)
        if horizon is not None and best.backlog > 0 and best.cost_s > horizon:
            rejections.append(Rejection(origin=a.origin, lm=a.lm))
            continue
        extra[(best.node, a.lm)] = extra.get((best.node, a.lm), 0) + a.prompts
        routes.append(Route(origin=a.origin, lm=a.lm, destination=best.node))
    routes.sort(key=lambda r: (r.origin, r.lm))
    rejections.sort(key=lambda r: (r.origin, r.lm))
    return RoutingMap(routes=routes, rejections=rejections)


@pytest.mark.parametrize(
    ("scenario", "profile", "seed"),
    [("testbed", "ma", 1), ("testbed", "rl", 2), ("large", "ma", 3)],
    ids=["testbed-ma", "testbed-no-macro-rl", "large-ma"],
)
def test_slot_table_routing_equals_candidates_ranking(
    scenario: str, profile: str, seed: int
) -> None:
    # Real states from the emulator: instances starting, running and draining,
    # queues, and the planner's macro policy (or none, with the rl profile).
    backend = emulated_backend(load_scenario(resolve_scenario(scenario)), seed)
    ctx = backend.context()
    loop = ControlLoop(backend, build_plugins(PolicyChoice(profile), ctx, seed), run_id="t")
    compared = 0
    for t in range(6):
        loop.step(t)
        plans = [d.value for d in loop.result.decisions if d.agent == "planner"]
        macro = plans[-1] if plans and profile == "ma" else None
        snapshot = backend.snapshot(t + 1)
        states = {n.name: n for n in snapshot.nodes}
        arrivals = backend.arrivals(t + 1)
        for admit in (0.3, None, 0.01):
            got = rule_routing(ctx, macro, states, arrivals, admit)
            want = reference_routing(ctx, macro, states, arrivals, admit)
            assert got == want, (t, admit)
            compared += len(want.routes) + len(want.rejections)
    assert compared > 0


@pytest.mark.parametrize("scenario", ["testbed", "large"])
def test_unit_index_picks_what_the_scan_picks(scenario: str) -> None:
    from lmedge.agents.rules import planner as rp

    ctx = emulated_backend(load_scenario(resolve_scenario(scenario)), 1).context()

    def budgets() -> list[rp._NodeBudget]:
        return [
            rp._NodeBudget(
                name=n.name,
                gpu=n.spec.has_gpu,
                vgpus_free=n.spec.total_vgpus,
                cores_free=max(0.0, n.spec.cpu_cores - rp.GPU_POD_CORES * n.spec.total_vgpus),
                mem_free=n.spec.memory_gib,
                vram_free=n.spec.total_vram_gib,
            )
            for n in ctx.workers
        ]

    lms = list(ctx.lm_names)
    # a previous plan naming some roles, so the role term of the key matters
    prev = {n.name: [lms[i % len(lms)]] for i, n in enumerate(ctx.workers) if i % 3 == 0}
    bs = budgets()
    units = rp._UnitIndex(ctx, lms, bs, prev)
    taken = 0
    for step in range(400):
        lm = lms[step % len(lms)]
        want = rp._best_unit(ctx, lm, bs, prev)
        got = units.best(lm)
        assert got == (None if want is None else want), step
        if want is None:
            continue
        rp._take(ctx, lm, want[0], want[1])
        units.changed(want[0])
        taken += 1
    assert taken > 20


def test_slot_table_equals_candidates_on_a_multi_site_sixteen_lm_cluster(tmp_path: Path) -> None:
    # Sites interleaved by worker name (consecutive origins have different link tables), 16 LMs
    # whose candidate sets differ, and deep queues after a few slots: the cached uplink columns,
    # the re-priced queue terms, the array tie-break and the rejection floor all take part.
    from lmedge.bench.scale import scale_scenario

    path = scale_scenario(tmp_path, 48, sites=4)
    backend = emulated_backend(load_scenario(path), 5)
    ctx = backend.context()
    loop = ControlLoop(backend, build_plugins(PolicyChoice("ma"), ctx, 5), run_id="t")
    compared = rejected = 0
    for t in range(4):
        loop.step(t)
        plans = [d.value for d in loop.result.decisions if d.agent == "planner"]
        states = {n.name: n for n in backend.snapshot(t + 1).nodes}
        arrivals = backend.arrivals(t + 1)
        for admit in (0.3, None):
            got = rule_routing(ctx, plans[-1], states, arrivals, admit)
            want = reference_routing(ctx, plans[-1], states, arrivals, admit)
            assert got == want, (t, admit)
            compared += len(want.routes)
            rejected += len(want.rejections)
    assert compared > 0 and rejected > 0


def test_compiled_routing_breaks_ties_and_prices_non_node_origins_as_the_ranking(
    tmp_path: Path,
) -> None:
    # An idle cluster of identical workers without a macro policy: every candidate ties
    # on cost until the first pairs land, so the weight-then-name tie-break decides;
    # and pairs from an origin that is no node (a gateway) carry no transfer.
    from lmedge.bench.scale import scale_scenario

    path = scale_scenario(tmp_path, 32, sites=4)
    backend = emulated_backend(load_scenario(path), 3)
    ctx = backend.context()
    states = {n.name: n for n in backend.snapshot(0).nodes}
    arrivals = backend.arrivals(0)
    gateway = [a.model_copy(update={"origin": "gateway"}) for a in arrivals[:20]]
    assert gateway and not ctx.has_node("gateway")
    routed = 0
    for admit in (0.3, None, 0.001):
        got = rule_routing(ctx, None, states, arrivals + gateway, admit)
        want = reference_routing(ctx, None, states, arrivals + gateway, admit)
        assert got == want, admit
        routed += len(want.routes)
    assert routed > 0


@pytest.mark.parametrize(
    ("weights", "want"),
    [((0.5, 0.5), 1), ((0.6, 0.4), 0)],
    ids=["equal-weight-own-node-wins", "higher-weight-wins"],
)
def test_routing_kernel_gives_a_cost_tie_to_the_own_node_only_at_equal_weight(
    weights: tuple[float, float], want: int
) -> None:
    # Column 0 at another site: 0 queue + 0.5 s uplink + 1 s service; column 1 is the
    # origin's own node: 0.5 s queue + 1 s service, no uplink. Both cost 1.5 s.
    import numpy as np

    from lmedge.agents.rules.routing_kernel import assign_pairs

    out = np.empty(1, np.int64)
    assign_pairs(
        np.array([0.0, 0.5]),  # base
        np.array([0, 1], np.int64),  # backlog
        np.array([1.0, 1.0]),  # rate
        np.array([0.0, 0.0]),  # wait
        np.array(weights),
        np.array([1, 0], np.intp),  # site
        np.array([[0.1, 0.5]]),  # transfers: the origin's row
        np.array([0], np.int64),  # row
        np.array([1], np.int64),  # own
        np.array([1], np.int64),  # added
        np.array([0], np.int64),  # floor_of
        np.array([[1.0, 1.0]]),  # pers
        np.array([np.nan]),  # floors
        np.array([0, 1], np.int64),  # group_of: one site group per column
        np.array([0, 1], np.int64),  # members
        np.array([0, 1, 2], np.int64),  # group_off
        np.array([1, 0], np.int64),  # group_site
        False,
        0.0,
        1,
        out,
    )
    assert out.tolist() == [want]
