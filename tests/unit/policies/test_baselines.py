"""The baseline plugins (random, static, uniform, local, full): table-driven.

Every plugin must produce feasible output for the testbed at any seed; beyond
that each test pins the rule that makes the baseline what it is.
"""

from __future__ import annotations

from collections import Counter

import pytest

from lmedge.api import (
    Arrival,
    ClusterContext,
    MacroPolicy,
    NodeObservation,
    NodeState,
    SlotObservation,
    Snapshot,
    check_macro_policy,
    check_placement,
    check_routing_map,
)
from lmedge.controller.catalog import BuildContext, build_deployer, build_planner, build_router
from lmedge.errors import ConfigError
from lmedge.policies.full import full_placement
from lmedge.policies.local import local_routing
from lmedge.policies.random import random_macro_policy
from lmedge.policies.uniform import uniform_macro_policy


def all_arrivals(ctx: ClusterContext) -> list[Arrival]:
    return [
        Arrival(origin=n.name, lm=lm, requests=1, prompts=4)
        for n in ctx.workers
        for lm in ctx.lm_names
    ]


def slot_obs(
    ctx: ClusterContext, macro: MacroPolicy | None = None, slot: int = 0
) -> SlotObservation:
    snap = Snapshot(slot=slot, time_s=0.0, nodes=[NodeState(name=n.name) for n in ctx.nodes])
    return SlotObservation(
        slot=slot, epoch=0, context=ctx, macro=macro, snapshot=snap, arrivals=all_arrivals(ctx)
    )


def node_obs(ctx: ClusterContext, node: str) -> NodeObservation:
    return NodeObservation(
        slot=0,
        epoch=0,
        node=ctx.node(node),
        services=ctx.services,
        roles=[],
        state=NodeState(name=node),
    )


@pytest.mark.parametrize("seed", range(20))
def test_random_macro_policy_is_feasible(ctx: ClusterContext, seed: int) -> None:
    import random

    policy = random_macro_policy(ctx, random.Random(seed))
    assert check_macro_policy(policy, ctx) == []
    for r in policy.routing:
        assert {w.node for w in r.weights} == set(ctx.feasible_nodes(r.lm))


def test_static_macro_policy_is_uniform_and_feasible(ctx: ClusterContext) -> None:
    policy = uniform_macro_policy(ctx)
    assert check_macro_policy(policy, ctx) == []
    lm4 = policy.weights()["lm4"]
    assert set(lm4) == {f"worker-{i}" for i in range(2, 7)}  # GPU-only: not the CPU node
    assert all(abs(p - 0.2) < 1e-6 for p in lm4.values())
    assert policy.role_map()["worker-1"] == ["lm1", "lm2"]


@pytest.mark.parametrize(
    ("router", "seed"),
    [("random", 0), ("random", 7), ("uniform", 0), ("local", 0)],
    ids=["random-0", "random-7", "uniform", "local"],
)
def test_routers_give_a_feasible_destination_to_every_pair(
    ctx: ClusterContext, router: str, seed: int
) -> None:
    plugin = build_router(router, BuildContext(ctx, seed))
    obs = slot_obs(ctx, uniform_macro_policy(ctx))
    d = plugin.route(obs)
    assert d.agent == "scheduler" and d.source == "rule" and d.policy == router
    assert check_routing_map(d.value, ctx, obs.arrivals) == []
    assert len(d.value.routes) == len(obs.arrivals)


@pytest.mark.parametrize(
    ("origin", "lm", "expected"),
    [
        ("worker-2", "lm1", "worker-2"),  # the origin hosts it
        ("worker-1", "lm1", "worker-1"),  # CPU node, cpu-or-gpu LM
        ("worker-1", "lm4", "worker-2"),  # GPU-only from the CPU node: same site (uob)
        ("control", "lm1", "worker-1"),  # control hosts nothing: same site, then name
    ],
    ids=["origin", "cpu-origin", "gpu-only-nearest-same-site", "control-origin"],
)
def test_local_routing_prefers_origin_then_nearest(
    ctx: ClusterContext, origin: str, lm: str, expected: str
) -> None:
    m = local_routing(ctx, [Arrival(origin=origin, lm=lm, requests=1, prompts=1)])
    assert m.lookup() == {(origin, lm): expected}


def test_random_router_is_seeded(ctx: ClusterContext) -> None:
    a = build_router("random", BuildContext(ctx, 3)).route(slot_obs(ctx)).value
    b = build_router("random", BuildContext(ctx, 3)).route(slot_obs(ctx)).value
    c = build_router("random", BuildContext(ctx, 4)).route(slot_obs(ctx)).value
    assert a == b
    assert a != c


def test_uniform_router_spreads_by_macro_weights(ctx: ClusterContext) -> None:
    router = build_router("uniform", BuildContext(ctx))
    macro = uniform_macro_policy(ctx)
    counts: Counter[str] = Counter()
    for slot in range(50):
        for r in router.route(slot_obs(ctx, macro, slot)).value.routes:
            if r.lm == "lm4":
                counts[r.destination] += 1
    # 6 origins x 50 slots = 300 pairs over 5 GPU workers: exactly 60 each.
    assert counts == {f"worker-{i}": 60 for i in range(2, 7)}


def test_uniform_router_follows_skewed_weights(ctx: ClusterContext) -> None:
    macro = uniform_macro_policy(ctx)
    for r in macro.routing:
        if r.lm == "lm3":
            for w in r.weights:
                w.p = 1.0 if w.node == "worker-6" else 0.0
    d = build_router("uniform", BuildContext(ctx)).route(slot_obs(ctx, macro))
    assert {r.destination for r in d.value.routes if r.lm == "lm3"} == {"worker-6"}


@pytest.mark.parametrize("node", [f"worker-{i}" for i in range(1, 7)])
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_random_deployer_is_feasible(ctx: ClusterContext, node: str, seed: int) -> None:
    d = build_deployer("random", BuildContext(ctx, seed)).place(node_obs(ctx, node))
    assert d.node == node and d.agent == "deployer"
    assert check_placement(d.value, ctx.node(node), ctx.services) == []


@pytest.mark.parametrize(
    ("node", "expected"),
    [
        # 24 cores: 4 + 4 default, the 16 left split evenly between the CPU-mode LMs.
        ("worker-1", {"lm1": ("cpu", 12, 0), "lm2": ("cpu", 12, 0)}),
        # 2 vGPUs: the GPU-only LMs take them; the text LMs run on CPU.
        (
            "worker-2",
            {
                "lm1": ("cpu", 4, 0),
                "lm2": ("cpu", 4, 0),
                "lm3": ("gpu", 4, 1),
                "lm4": ("gpu", 4, 1),
            },
        ),
        ("worker-6", {lm: ("gpu", 4, 1) for lm in ("lm1", "lm2", "lm3", "lm4")}),
        ("control", {}),
    ],
    ids=["cpu-node", "one-gpu", "two-gpus", "control"],
)
def test_full_placement_activates_everything_that_fits(
    ctx: ClusterContext, node: str, expected: dict[str, tuple[str, float, int]]
) -> None:
    p = full_placement(ctx.node(node), ctx.services)
    assert check_placement(p, ctx.node(node), ctx.services) == []
    got = {x.lm: (x.mode, x.cpu_cores, x.vgpus) for x in p.active().values()}
    assert got == expected


def test_full_deployer_never_reconfigures(ctx: ClusterContext) -> None:
    dep = build_deployer("full", BuildContext(ctx))
    first = dep.place(node_obs(ctx, "worker-3")).value
    assert all(dep.place(node_obs(ctx, "worker-3")).value == first for _ in range(5))


@pytest.mark.parametrize(
    ("kind", "name"),
    [("planner", "random"), ("router", "local"), ("deployer", "full")],
)
def test_baselines_reject_parameters(ctx: ClusterContext, kind: str, name: str) -> None:
    build = {"planner": build_planner, "router": build_router, "deployer": build_deployer}[kind]
    with pytest.raises(ConfigError, match="takes no parameters"):
        build(name, BuildContext(ctx, 0, {"temperature": 1}))  # type: ignore[operator]


def test_unknown_plugin_names_are_config_errors(ctx: ClusterContext) -> None:
    with pytest.raises(ConfigError, match="unknown router 'nope'"):
        build_router("nope", BuildContext(ctx))
