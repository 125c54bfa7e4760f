"""The rule backends: feasible by construction, and the behaviours they document."""

from __future__ import annotations

import math

import pytest

from lmedge.agents.deployer import AgenticDeployer
from lmedge.agents.rules.deployer import REFIT_HOLD_S, rule_placement
from lmedge.agents.rules.planner import (
    BOOST_MAX,
    RulePlannerState,
    capacity,
    demand,
    plan_macro,
    rule_macro_policy,
    update_boost,
)
from lmedge.agents.rules.scheduler import rule_routing
from lmedge.api import (
    Arrival,
    ClusterContext,
    EpochMetrics,
    InstanceState,
    LMPlacement,
    LMStats,
    MacroPolicy,
    NodeObservation,
    NodeState,
    Placement,
    PlannedMode,
    PlanningObservation,
    check_macro_policy,
    check_placement,
    check_routing_map,
)
from lmedge.api.constants import SLOT_S
from lmedge.sim.scenario import Scenario


def _metrics(ratios: dict[str, float]) -> EpochMetrics:
    return EpochMetrics(
        per_lm=[
            LMStats(lm=lm, arrivals=100, successes=int(r * 100), success_ratio=r, mean_latency_s=60)
            for lm, r in ratios.items()
        ],
        requests=400,
        successes=200,
        mean_latency_s=60,
        jain=0.8,
        f_norm=0.7,
        t_norm=0.1,
        objective=0.2,
    )


@pytest.mark.parametrize("name", ["testbed", "large"])
def test_planner_policy_is_feasible_and_uses_every_worker(
    name: str, request: pytest.FixtureRequest
) -> None:
    scenario: Scenario = request.getfixturevalue(name)
    ctx = scenario.context()
    policy = plan_macro(ctx, {}, {})
    assert check_macro_policy(policy, ctx) == []
    roles = policy.role_map()
    for lm in ctx.lm_names:
        assert any(lm in roles.get(n, []) for n in ctx.feasible_nodes(lm)), f"{lm} has no node"
    idle = [n.name for n in ctx.workers if not roles.get(n.name)]
    assert idle == [], "no worker is left without a role"


@pytest.mark.parametrize("lm", ["lm1", "lm2", "lm3", "lm4"])
def test_planner_keeps_no_node_back_as_a_shedding_sink(ctx: ClusterContext, lm: str) -> None:
    # With one LM alone on the cluster, it may take every node it can run on.
    alone = ClusterContext.model_validate(
        ctx.model_dump() | {"services": [ctx.service(lm).model_dump()]}
    )
    roles = plan_macro(alone, {lm: 100}, {}).role_map()
    hosting = [n for n in alone.feasible_nodes(lm) if lm in roles.get(n, [])]
    assert hosting == alone.feasible_nodes(lm)


def test_planner_spreads_the_gpu_only_lm_and_uses_the_cpu_node(ctx: ClusterContext) -> None:
    policy = plan_macro(ctx, {"lm1": 100, "lm2": 100, "lm3": 100, "lm4": 100}, {})
    w = policy.weights()
    assert w["lm4"].keys() <= {"worker-2", "worker-3", "worker-4", "worker-5", "worker-6"}
    assert len(w["lm4"]) >= 4, "the heaviest GPU-only LM spreads over GPU nodes"
    cpu_node = policy.role_map()["worker-1"]
    assert cpu_node and all(ctx.service(lm).spec.runs_on == "cpu-or-gpu" for lm in cpu_node)
    assert abs(sum(w["lm3"].values()) - 1) < 1e-6


def test_boost_moves_capacity_to_the_lm_that_failed(ctx: ClusterContext) -> None:
    state = RulePlannerState()
    update_boost(state, _metrics({"lm1": 0.9, "lm2": 0.9, "lm3": 0.9, "lm4": 0.1}))
    assert state.boost["lm4"] > 1 > state.boost["lm1"]
    for _ in range(20):
        update_boost(state, _metrics({"lm1": 0.9, "lm2": 0.9, "lm3": 0.9, "lm4": 0.0}))
    assert state.boost["lm4"] == BOOST_MAX
    traffic = {"lm1": 100, "lm2": 100, "lm3": 100, "lm4": 100}
    plain = plan_macro(ctx, traffic, {})
    boosted = plan_macro(ctx, traffic, state.boost)
    nodes = [r.node for r in boosted.roles if "lm4" in r.lms]
    assert len(nodes) >= len([r.node for r in plain.roles if "lm4" in r.lms])
    assert "lm4" in boosted.rationale


def test_replan_keeps_the_bottleneck_capacity_unless_the_highest_load_drops(
    large: Scenario,
) -> None:
    # Epoch 1 planned with lm4 boosted (the bottleneck); epoch 2's traffic swings to
    # lm1/lm2. The fresh water-filling would move units off lm4 and leave the highest
    # relative load higher (lm4 71 vs 70): the previous roles stay, re-weighted.
    ctx = large.context()
    previous = plan_macro(
        ctx,
        {"lm1": 3200, "lm2": 800, "lm3": 800, "lm4": 1600},
        {"lm1": 1, "lm2": 2, "lm3": 0.5, "lm4": 3},
    )
    traffic = {"lm1": 1600, "lm2": 1600, "lm3": 800, "lm4": 100}
    boost = {"lm1": 1, "lm2": 2, "lm3": 1, "lm4": 3}
    guarded = plan_macro(ctx, traffic, boost, previous)
    fresh = plan_macro(ctx, traffic, boost)
    assert check_macro_policy(guarded, ctx) == []
    assert "previous roles kept" in guarded.rationale
    before, after = previous.role_map(), guarded.role_map()
    assert all(set(lms) <= set(before[node]) for node, lms in after.items())
    assert after != fresh.role_map(), "the guard changed the plan"
    # A node lost since (churn) does not lift the guard: the roles on the nodes left
    # stay, and the lost node's share goes to the LMs that held roles beside it.
    down = ClusterContext.model_validate(
        ctx.model_dump() | {"nodes": [n.model_dump() for n in ctx.nodes if n.name != "worker-001"]}
    )
    # Without `follow_traffic` (mal's planner) churn lifts the guard: the fresh plan.
    assert "previous roles kept" not in plan_macro(down, traffic, boost, previous).rationale
    after_loss = plan_macro(down, traffic, boost, previous, follow_traffic=True)
    assert check_macro_policy(after_loss, down) == []
    assert "previous roles kept" in after_loss.rationale
    kept = after_loss.role_map()
    assert "worker-001" not in kept
    assert all(set(lms) <= set(before[node]) for node, lms in kept.items())


def test_an_lm_without_history_is_planned_from_its_capacity(large: Scenario) -> None:
    # No traffic at all (the first plan, a guess re-made once traffic is seen): equal shares.
    ctx = large.context()
    assert set(demand(ctx, {}, {}).values()) == {1.0}
    # An LMService applied since the previous plan: the mean relative load of the LMs
    # with traffic, not the floor of an LM with no prompts.
    traffic = {"lm1": 1600, "lm2": 1600, "lm4": 100}
    previous = plan_macro(ctx, {**traffic, "lm3": 100}, {})
    older = previous.model_copy(update={"routing": [r for r in previous.routing if r.lm != "lm3"]})
    d = demand(ctx, traffic, {}, older)
    mean = sum(traffic[lm] / capacity(ctx, lm) for lm in traffic) / len(traffic)
    assert d["lm3"] == pytest.approx(mean * capacity(ctx, "lm3"))
    # Known to the previous plan and without prompts: the floor, not the prior.
    assert demand(ctx, traffic, {}, previous)["lm3"] < d["lm3"] / 10
    policy = plan_macro(ctx, traffic, {}, older, follow_traffic=True)
    assert check_macro_policy(policy, ctx) == []
    assert len(policy.weights()["lm3"]) > 1, "a new LM spreads, not one node"
    # Without `follow_traffic` the new LM plans from its traffic (none): the floor.
    assert len(plan_macro(ctx, traffic, {}, older).weights()["lm3"]) <= len(policy.weights()["lm3"])


def _states(ctx: ClusterContext, backlog: int = 0, running: bool = True) -> dict[str, NodeState]:
    policy = plan_macro(ctx, {}, {})
    out = {}
    for n in ctx.workers:
        lms = policy.role_map()[n.name]
        inst = (
            [
                InstanceState(
                    lm=lm,
                    mode="gpu" if n.spec.has_gpu and lm != "lm1" else "cpu",
                    cpu_cores=2,
                    vgpus=1 if n.spec.has_gpu and lm != "lm1" else 0,
                    status="ready",
                )
                for lm in lms
            ]
            if running
            else []
        )
        out[n.name] = NodeState(name=n.name, backlog=dict.fromkeys(lms, backlog), instances=inst)
    return out


def _arrivals(ctx: ClusterContext, prompts: int = 1) -> list[Arrival]:
    return [
        Arrival(origin=n.name, lm=lm, requests=1, prompts=prompts)
        for n in ctx.workers
        for lm in ctx.lm_names
    ]


def test_scheduler_routes_every_pair_to_planned_nodes(ctx: ClusterContext) -> None:
    macro = plan_macro(ctx, {}, {})
    arrivals = _arrivals(ctx)
    routing = rule_routing(ctx, macro, _states(ctx), arrivals)
    assert check_routing_map(routing, ctx, arrivals) == []
    roles = macro.role_map()
    assert all(r.lm in roles[r.destination] for r in routing.routes)


def test_scheduler_rejects_what_cannot_finish_in_time(ctx: ClusterContext) -> None:
    macro = plan_macro(ctx, {}, {})
    arrivals = _arrivals(ctx)
    routing = rule_routing(ctx, macro, _states(ctx, backlog=500), arrivals, admit_fraction=0.15)
    assert check_routing_map(routing, ctx, arrivals) == []
    assert routing.routes == [], "every queue is far beyond the horizon: nothing is parked"
    assert routing.rejected() == {(a.origin, a.lm) for a in arrivals}


def test_scheduler_admits_anything_to_an_empty_queue(ctx: ClusterContext) -> None:
    macro = plan_macro(ctx, {}, {})
    arrivals = [Arrival(origin="worker-2", lm="lm4", requests=1, prompts=64)]
    routing = rule_routing(ctx, macro, _states(ctx), arrivals)
    assert "lm4" in macro.role_map()[routing.routes[0].destination]


def test_scheduler_without_macro_uses_feasible_nodes(ctx: ClusterContext) -> None:
    arrivals = _arrivals(ctx)
    routing = rule_routing(ctx, None, _states(ctx, running=False), arrivals)
    assert check_routing_map(routing, ctx, arrivals) == []


def _node_obs(
    ctx: ClusterContext, node: str, roles: list[str], state: NodeState
) -> NodeObservation:
    return NodeObservation(
        slot=1, epoch=0, node=ctx.node(node), services=ctx.services, roles=roles, state=state
    )


@pytest.mark.parametrize("node", ["worker-1", "worker-2", "worker-6", "control"])
def test_deployer_starts_the_role_feasibly(ctx: ClusterContext, node: str) -> None:
    macro = plan_macro(ctx, {}, {})
    roles = macro.role_map().get(node, [])
    obs = _node_obs(ctx, node, roles, NodeState(name=node, backlog=dict.fromkeys(roles, 3)))
    placement = rule_placement(obs)
    assert check_placement(placement, obs.node, ctx.services) == []
    assert sorted(placement.active()) == sorted(roles)
    for p in placement.active().values():
        if ctx.node(node).spec.total_vgpus > 2:
            assert p.vgpus <= 1, "one vGPU per pod on a multi-GPU node"


def test_deployer_lm1_on_cores_next_to_gpu_pods(ctx: ClusterContext) -> None:
    obs = _node_obs(ctx, "worker-2", ["lm1", "lm3", "lm4"], NodeState(name="worker-2"))
    active = rule_placement(obs).active()
    assert active["lm1"].mode == "cpu" and active["lm1"].cpu_cores >= 8
    assert active["lm3"].mode == active["lm4"].mode == "gpu"


def test_deployer_keeps_running_pods_and_waits_while_pending(ctx: ClusterContext) -> None:
    running = InstanceState(lm="lm4", mode="gpu", cpu_cores=3, vgpus=2, status="ready")
    state = NodeState(name="worker-2", backlog={"lm3": 5, "lm4": 1}, instances=[running])
    alone = _node_obs(ctx, "worker-2", ["lm4"], state.model_copy(update={"backlog": {"lm4": 1}}))
    active = rule_placement(alone).active()
    assert (active["lm4"].cpu_cores, active["lm4"].vgpus) == (3, 2), "no resize churn"
    obs = _node_obs(ctx, "worker-2", ["lm3", "lm4"], state)
    active = rule_placement(obs).active()
    assert active["lm4"].vgpus == 1, "lm4 gives up its extra vGPU rather than strand lm3"
    assert active["lm3"].mode == "gpu"
    pending = running.model_copy(update={"status": "pending"})
    obs = _node_obs(
        ctx, "worker-2", ["lm3", "lm4"], state.model_copy(update={"instances": [pending]})
    )
    assert list(rule_placement(obs).active()) == ["lm4"]


def test_deployer_serves_every_queue_even_off_role(ctx: ClusterContext) -> None:
    left = InstanceState(lm="lm2", mode="gpu", cpu_cores=2, vgpus=1, status="ready")
    state = NodeState(name="worker-3", backlog={"lm3": 9, "lm2": 4}, instances=[left])
    active = rule_placement(_node_obs(ctx, "worker-3", ["lm4"], state)).active()
    assert "lm3" in active, "queued off-role work is started, not stranded"
    assert "lm2" in active, "a running LM with backlog keeps running"
    assert "lm4" not in active, "the idle role LM yields the last vGPU to queued work"


def test_deployer_moves_a_text_lm_to_cores_for_a_gpu_only_role(ctx: ClusterContext) -> None:
    # lm1 and lm2 hold both vGPUs; lm4 (GPU only) joins the role with queued work.
    run = [
        InstanceState(lm=lm, mode="gpu", cpu_cores=2, vgpus=1, status="ready")
        for lm in ("lm1", "lm2")
    ]
    state = NodeState(name="worker-3", backlog={"lm1": 9, "lm2": 10, "lm4": 22}, instances=run)
    active = rule_placement(_node_obs(ctx, "worker-3", ["lm1", "lm2", "lm4"], state)).active()
    assert set(active) == {"lm1", "lm2", "lm4"}, "every queue keeps a pod"
    assert active["lm4"].mode == "gpu"
    assert [active[lm].mode for lm in ("lm1", "lm2")].count("cpu") == 1


@pytest.mark.parametrize(
    ("backlog", "mode"),
    [(0, "cpu"), (1, "cpu"), (4, "gpu")],
    ids=["idle-stays", "gain-below-cold-start-stays", "gain-above-cold-start-moves"],
)
def test_deployer_moves_a_text_lm_from_cores_to_a_freed_vgpu(
    ctx: ClusterContext, backlog: int, mode: str
) -> None:
    # lm1 was started on cores while both vGPUs were taken; one is free now. On
    # 8 cores a prompt takes ~6.1 s, on half the GPU 1.2 s: one queued prompt
    # saves less than a cold start (9.34 s), four save more.
    run = [
        InstanceState(lm="lm1", mode="cpu", cpu_cores=8, vgpus=0, status="ready"),
        InstanceState(lm="lm3", mode="gpu", cpu_cores=2, vgpus=1, status="ready"),
    ]
    state = NodeState(name="worker-2", backlog={"lm1": backlog, "lm3": 2}, instances=run)
    obs = _node_obs(ctx, "worker-2", ["lm1", "lm3"], state)
    placement = rule_placement(obs)
    assert check_placement(placement, obs.node, ctx.services) == []
    active = placement.active()
    assert active["lm1"].mode == mode
    assert (active["lm3"].mode, active["lm3"].vgpus) == ("gpu", 1), "the neighbour is untouched"


@pytest.mark.parametrize(
    ("neighbour_backlog", "vgpus"),
    [(0, 1), (3, 2)],
    ids=["alone-on-the-gpu-no-gain", "beside-a-busy-pod-grows"],
)
def test_deployer_grows_a_gpu_pod_onto_free_vgpus_only_under_contention(
    ctx: ClusterContext, neighbour_backlog: int, vgpus: int
) -> None:
    # worker-2's GPU cut into 4 slots, 2 free. Time-slicing by busy slots: beside a
    # busy lm3, lm4's share goes 1/2 -> 2/3 (3 prompts save ~15 s, more than a cold
    # start); beside an idle one it already has the whole GPU.
    node = ctx.node("worker-2")
    node = node.model_copy(update={"spec": node.spec.model_copy(update={"vgpus_per_gpu": 4})})
    run = [
        InstanceState(lm="lm4", mode="gpu", cpu_cores=2, vgpus=1, status="ready"),
        InstanceState(lm="lm3", mode="gpu", cpu_cores=2, vgpus=1, status="ready"),
    ]
    state = NodeState(name="worker-2", backlog={"lm4": 3, "lm3": neighbour_backlog}, instances=run)
    obs = NodeObservation(
        slot=1, epoch=0, node=node, services=ctx.services, roles=["lm3", "lm4"], state=state
    )
    placement = rule_placement(obs)
    assert check_placement(placement, node, ctx.services) == []
    active = placement.active()
    assert active["lm4"].vgpus == vgpus
    assert active["lm3"].vgpus == 1


@pytest.mark.parametrize(
    ("lm2_backlog", "lm2_mode"),
    [(1, "cpu"), (12, "gpu")],
    ids=["gain-below-restarts-stays", "gain-above-restarts-swaps"],
)
def test_deployer_gives_the_vgpu_to_the_text_lm_that_gains_most(
    ctx: ClusterContext, lm2_backlog: int, lm2_mode: str
) -> None:
    # lm2 was started on cores while lm1 and lm3 held both vGPUs; nothing frees.
    # lm2 takes ~4 s a prompt on 8 cores and 1.2 s on a vGPU, lm1 0.6 s on a vGPU
    # and ~6 s on cores: with 12 lm2 prompts queued and one of lm1's, the swap
    # (two restarts, a cold start each) is estimated better for the node's
    # queues; with one of lm2's it is not and the pods stay as they are.
    run = [
        InstanceState(lm="lm1", mode="gpu", cpu_cores=2, vgpus=1, status="ready"),
        InstanceState(lm="lm2", mode="cpu", cpu_cores=8, vgpus=0, status="ready"),
        InstanceState(lm="lm3", mode="gpu", cpu_cores=2, vgpus=1, status="ready"),
    ]
    backlog = {"lm1": 1, "lm2": lm2_backlog, "lm3": 2}
    state = NodeState(name="worker-2", backlog=backlog, instances=run)
    obs = _node_obs(ctx, "worker-2", ["lm1", "lm2", "lm3"], state)
    placement = rule_placement(obs)
    assert check_placement(placement, obs.node, ctx.services) == []
    active = placement.active()
    assert set(active) == {"lm1", "lm2", "lm3"}, "every queue keeps a pod"
    assert active["lm2"].mode == lm2_mode
    assert active["lm1"].mode == ("cpu" if lm2_mode == "gpu" else "gpu")
    assert (active["lm3"].mode, active["lm3"].vgpus) == ("gpu", 1), "the GPU-only LM keeps its"


def test_deployer_does_not_swap_pods_back_before_they_pay_back_their_restart(
    ctx: ClusterContext,
) -> None:
    # Slot 3: lm2's queue pays for the swap (as in the test above), lm2 takes
    # lm1's vGPU. Slot 4: the queues have moved, lm1 has the long one, and the
    # one-slot estimate alone would swap back: two more restarts. The deployer
    # remembers the pods it saw start and holds them for REFIT_HOLD_S; after
    # that the same observation re-fits again.
    deployer = AgenticDeployer.build(ctx, {})
    run = [
        InstanceState(lm="lm1", mode="gpu", cpu_cores=2, vgpus=1, status="ready"),
        InstanceState(lm="lm2", mode="cpu", cpu_cores=8, vgpus=0, status="ready"),
        InstanceState(lm="lm3", mode="gpu", cpu_cores=2, vgpus=1, status="ready"),
    ]

    def obs_at(slot: int, pods: list[InstanceState], backlog: dict[str, int]) -> NodeObservation:
        state = NodeState(name="worker-2", backlog=backlog, instances=pods)
        return _node_obs(ctx, "worker-2", ["lm1", "lm2", "lm3"], state).model_copy(
            update={"slot": slot}
        )

    deployer.place(obs_at(2, run, {"lm1": 1, "lm2": 1, "lm3": 2}))  # pods of unknown age
    swapped = deployer.place(obs_at(3, run, {"lm1": 1, "lm2": 12, "lm3": 2})).value.active()
    assert (swapped["lm2"].mode, swapped["lm1"].mode) == ("gpu", "cpu"), "old pods re-fit"
    now = [
        InstanceState(lm=p.lm, mode=p.mode, cpu_cores=p.cpu_cores, vgpus=p.vgpus, status="ready")
        for p in swapped.values()
    ]
    flipped = {"lm1": 12, "lm2": 1, "lm3": 2}
    back = rule_placement(obs_at(4, now, flipped)).active()
    assert (back["lm1"].mode, back["lm2"].mode) == ("gpu", "cpu"), "the estimate alone swaps back"
    held = deployer.place(obs_at(4, now, flipped)).value.active()
    assert (held["lm1"].mode, held["lm2"].mode) == ("cpu", "gpu"), "young pods are held"
    later = 4 + math.ceil(REFIT_HOLD_S / SLOT_S)
    again = deployer.place(obs_at(later, now, flipped)).value.active()
    assert (again["lm1"].mode, again["lm2"].mode) == ("gpu", "cpu"), "paid back: re-fit again"


def test_deployer_gpu_pods_share_scarce_cores_rather_than_idle_vgpus(
    ctx: ClusterContext,
) -> None:
    # 4 cores, 4 vGPUs, four LMs with queued work that all run faster on a vGPU:
    # at GPU_POD_CORES (2) each only two would start and two vGPUs would idle.
    node = ctx.node("worker-2")
    spec = node.spec.model_copy(update={"vgpus_per_gpu": 4, "cpu_cores": 4})
    node = node.model_copy(update={"spec": spec})
    lms = ["lm1", "lm2", "lm3", "lm4"]
    state = NodeState(name="worker-2", backlog=dict.fromkeys(lms, 3))
    obs = NodeObservation(slot=1, epoch=0, node=node, services=ctx.services, roles=lms, state=state)
    placement = rule_placement(obs)
    assert check_placement(placement, node, ctx.services) == []
    active = placement.active()
    assert sorted(active) == lms
    assert all(p.mode == "gpu" and p.vgpus == 1 and p.cpu_cores == 1 for p in active.values())


def test_deployer_keeps_an_off_role_lm_with_backlog(ctx: ClusterContext) -> None:
    running = InstanceState(lm="lm1", mode="cpu", cpu_cores=8, vgpus=0, status="ready")
    state = NodeState(name="worker-1", backlog={"lm1": 3}, instances=[running])
    active = rule_placement(_node_obs(ctx, "worker-1", ["lm2"], state)).active()
    assert "lm1" in active, "the router just sent lm1 work here: it must keep running"


def test_rule_step_updates_boost(ctx: ClusterContext) -> None:
    state = RulePlannerState()
    obs = PlanningObservation(
        epoch=1, context=ctx, last=_metrics({"lm1": 1.0, "lm2": 0.5, "lm3": 0.5, "lm4": 0.2})
    )
    policy = rule_macro_policy(obs, state)
    assert isinstance(policy, MacroPolicy) and state.boost["lm4"] > 1


def test_admission_off_refuses_nothing(ctx: ClusterContext) -> None:
    from lmedge.agents.scheduler import AgenticRouter
    from lmedge.errors import ConfigError

    macro = plan_macro(ctx, {}, {})
    arrivals = _arrivals(ctx)
    routing = rule_routing(ctx, macro, _states(ctx, backlog=500), arrivals, admit_fraction=None)
    roles = macro.role_map()
    assert routing.rejections == [], "off: every set is admitted"
    assert all(r.lm in roles[r.destination] for r in routing.routes), "and routed to a planned node"
    assert AgenticRouter.build(ctx, {"admit_fraction": "off"}).admit_fraction is None
    assert AgenticRouter.build(ctx, {"admit_fraction": "0.3"}).admit_fraction == 0.3
    with pytest.raises(ConfigError, match="admit_fraction"):
        AgenticRouter.build(ctx, {"admit_fraction": "2"})


def test_admission_admits_the_small_set_before_the_large_one(ctx: ClusterContext) -> None:
    # One GPU node for lm4 with 5 prompts queued: at ~20 s per prompt (one of two
    # vGPUs) a 0.3 x 900 = 270-s horizon holds 13 prompts. Either set fits alone,
    # not both; taking the small one first serves one request instead of
    # refusing it behind the large one (success ratios count requests).
    one = ClusterContext.model_validate(
        ctx.model_dump()
        | {
            "nodes": [ctx.node("worker-2").model_dump()],
            "services": [ctx.service("lm4").model_dump()],
        }
    )
    lm4 = InstanceState(lm="lm4", mode="gpu", cpu_cores=2, vgpus=1, status="ready")
    states = {"worker-2": NodeState(name="worker-2", backlog={"lm4": 5}, instances=[lm4])}
    arrivals = [
        Arrival(origin="worker-2", lm="lm4", requests=1, prompts=8),
        Arrival(origin="edge", lm="lm4", requests=1, prompts=1),
    ]
    routing = rule_routing(one, plan_macro(one, {}, {}), states, arrivals, admit_fraction=0.3)
    assert [(r.origin, r.destination) for r in routing.routes] == [("edge", "worker-2")]
    assert routing.rejected() == {("worker-2", "lm4")}


@pytest.mark.parametrize("pending", [False, True])
@pytest.mark.parametrize("node", ["worker-1", "worker-2", "worker-3", "worker-6", "control"])
def test_deployer_placements_equal_validated_models(
    ctx: ClusterContext, node: str, pending: bool
) -> None:
    # The rule builds its placements without validation (api.base.built).
    run = [
        InstanceState(
            lm=lm, mode="gpu", cpu_cores=2, vgpus=1, status="pending" if pending else "ready"
        )
        for lm in ("lm2", "lm4")
    ]
    state = NodeState(name=node, backlog={"lm1": 9, "lm3": 4, "lm4": 2}, instances=run)
    for roles in ([], ["lm1"], ["lm1", "lm2", "lm3", "lm4"]):
        placement = rule_placement(_node_obs(ctx, node, roles, state))
        again = Placement.model_validate(placement.model_dump())
        assert again == placement and again.model_dump_json() == placement.model_dump_json()
        assert [p.lm for p in placement.lms] == [s.name for s in ctx.services]
        for p in placement.lms:
            assert p.model_fields_set == set(LMPlacement.model_fields)
            assert isinstance(p.cpu_cores, float)


def test_planner_gives_every_role_its_units_mode(ctx: ClusterContext) -> None:
    policy = plan_macro(ctx, {"lm1": 100, "lm2": 100, "lm3": 100, "lm4": 100}, {})
    assert check_macro_policy(policy, ctx) == []
    for role in policy.roles:
        assert set(role.modes) == set(role.lms), role.node
        for lm, mode in role.modes.items():
            assert mode in ctx.modes(role.node, lm)
    modes = policy.mode_map()
    assert modes["worker-1"] == dict.fromkeys(policy.role_map()["worker-1"], "cpu"), "CPU node"
    assert {m for r in modes.values() for lm, m in r.items() if lm in ("lm3", "lm4")} == {"gpu"}


def _planned_obs(
    ctx: ClusterContext, node: str, modes: dict[str, PlannedMode], state: NodeState
) -> NodeObservation:
    return _node_obs(ctx, node, list(modes), state).model_copy(update={"modes": modes})


@pytest.mark.parametrize(
    ("modes", "want"),
    [
        (
            {"lm1": "gpu", "lm2": "cpu", "lm3": "gpu"},
            {"lm1": "gpu", "lm2": "cpu", "lm3": "gpu"},
        ),
        ({"lm1": "cpu", "lm3": "gpu"}, {"lm1": "gpu", "lm3": "gpu"}),
        ({"lm1": "gpu", "lm3": "gpu", "lm4": "gpu"}, {"lm1": "cpu", "lm3": "gpu", "lm4": "gpu"}),
    ],
    ids=[
        "the-planned-gpu-text-lm-takes-the-last-vgpu",
        "a-vgpu-no-gpu-planned-lm-took-does-not-idle",
        "no-vgpu-left-falls-back-to-cores",
    ],
)
def test_deployer_follows_the_planned_mode_as_a_preference(
    ctx: ClusterContext, modes: dict[str, PlannedMode], want: dict[str, str]
) -> None:
    # worker-2: one GPU cut into 2 vGPUs; lm3 (GPU only) takes one first.
    state = NodeState(name="worker-2", backlog=dict.fromkeys(modes, 2))
    obs = _planned_obs(ctx, "worker-2", modes, state)
    placement = rule_placement(obs, follow_modes=True)
    assert check_placement(placement, obs.node, ctx.services) == []
    assert {lm: p.mode for lm, p in placement.active().items()} == want


def test_deployer_reads_the_planned_modes_only_when_told(ctx: ClusterContext) -> None:
    # Without the plan lm2 (more queued work: 2 x 1.2 s against lm1's 2 x 0.6 s)
    # takes the vGPU lm3 leaves; the plan gives it to lm1.
    modes: dict[str, PlannedMode] = {"lm1": "gpu", "lm2": "cpu", "lm3": "gpu"}
    state = NodeState(name="worker-2", backlog=dict.fromkeys(modes, 2))
    obs = _planned_obs(ctx, "worker-2", modes, state)
    default = rule_placement(obs)
    assert default == rule_placement(obs.model_copy(update={"modes": {}}))
    assert (default.active()["lm1"].mode, default.active()["lm2"].mode) == ("cpu", "gpu")
    followed = rule_placement(obs, follow_modes=True).active()
    assert (followed["lm1"].mode, followed["lm2"].mode) == ("gpu", "cpu")


def test_deployer_ignores_a_planned_mode_the_node_does_not_open(ctx: ClusterContext) -> None:
    # worker-1 has no GPU: a plan that says gpu for lm1 there still runs lm1 (on cores).
    state = NodeState(name="worker-1", backlog={"lm1": 3})
    obs = _planned_obs(ctx, "worker-1", {"lm1": "gpu"}, state)
    assert rule_placement(obs, follow_modes=True).active()["lm1"].mode == "cpu"


@pytest.mark.parametrize("follow", [True, False], ids=["followed-refits", "default-keeps"])
def test_deployer_refits_a_text_lm_holding_the_vgpu_the_plan_gave_a_gpu_only_lm(
    ctx: ClusterContext, follow: bool
) -> None:
    # lm1 and lm2 run on both of worker-3's vGPUs (an earlier plan); the new plan
    # puts lm2 on cores and gives its vGPU to lm4 (GPU only), which has no queue
    # yet: the router sends work only at a cold start's extra cost where an LM
    # does not run, so waiting for a queue could keep lm4 off all epoch.
    run = [
        InstanceState(lm=lm, mode="gpu", cpu_cores=2, vgpus=1, status="ready")
        for lm in ("lm1", "lm2")
    ]
    state = NodeState(name="worker-3", backlog={"lm1": 3, "lm2": 3}, instances=run)
    modes: dict[str, PlannedMode] = {"lm1": "gpu", "lm2": "cpu", "lm4": "gpu"}
    obs = _planned_obs(ctx, "worker-3", modes, state)
    placement = rule_placement(obs, follow_modes=follow)
    assert check_placement(placement, obs.node, ctx.services) == []
    active = placement.active()
    assert set(active) >= {"lm1", "lm2"}, "queued work keeps its pods"
    assert active["lm1"] == LMPlacement(lm="lm1", mode="gpu", cpu_cores=2, vgpus=1), "untouched"
    if follow:
        assert (active["lm2"].mode, active["lm4"].mode) == ("cpu", "gpu")
    else:
        assert "lm4" not in active and active["lm2"].mode == "gpu", "no resize for an idle role"
