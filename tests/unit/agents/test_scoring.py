"""The scoring guard's estimates and choice (lmedge.agents.scoring): pure logic."""

from __future__ import annotations

from lmedge.agents.rules.deployer import rule_placement
from lmedge.agents.rules.planner import RulePlannerState, plan_macro, rule_macro_policy
from lmedge.agents.rules.scheduler import rule_routing
from lmedge.agents.scoring import (
    GUARD_MARGIN,
    choose,
    macro_objective,
    placement_objective,
    routing_objective,
)
from lmedge.api import (
    Arrival,
    ClusterContext,
    InstanceState,
    LMRouting,
    MacroPolicy,
    NodeObservation,
    NodeState,
    PlanningObservation,
    Rejection,
    Route,
    RouteWeight,
    RoutingMap,
    SlotObservation,
    Snapshot,
)


def _slot(ctx: ClusterContext, prompts: int) -> SlotObservation:
    macro = plan_macro(ctx, {}, {})
    nodes = [
        NodeState(
            name=n.name,
            instances=[
                InstanceState(lm=lm, mode="gpu", cpu_cores=2, vgpus=1, status="ready")
                for lm in ctx.lm_names
                if n.spec.has_gpu
            ],
        )
        for n in ctx.workers
    ]
    arrivals = [
        Arrival(origin=n.name, lm=lm, requests=prompts, prompts=prompts)
        for n in ctx.workers
        for lm in ctx.lm_names
    ]
    return SlotObservation(
        slot=0,
        epoch=0,
        context=ctx,
        macro=macro,
        snapshot=Snapshot(slot=0, time_s=0, nodes=nodes),
        arrivals=arrivals,
    )


def _one_node(obs: SlotObservation, node: str) -> RoutingMap:
    return RoutingMap(
        routes=[Route(origin=a.origin, lm=a.lm, destination=node) for a in obs.arrivals]
    )


def test_everything_to_one_node_is_estimated_worse_than_the_rule(ctx: ClusterContext) -> None:
    obs = _slot(ctx, prompts=20)
    states = {n.name: n for n in obs.snapshot.nodes}
    rule = rule_routing(ctx, obs.macro, states, obs.arrivals, admit_fraction=None)
    harmful = routing_objective(obs, _one_node(obs, "worker-2"))
    assert harmful > routing_objective(obs, rule) + GUARD_MARGIN, "beyond the margin: overruled"


def test_a_rejected_pair_counts_as_failures(ctx: ClusterContext) -> None:
    obs = _slot(ctx, prompts=1)
    states = {n.name: n for n in obs.snapshot.nodes}
    rule = rule_routing(ctx, obs.macro, states, obs.arrivals, admit_fraction=None)
    first = rule.routes[0]
    refused = RoutingMap(
        routes=rule.routes[1:], rejections=[Rejection(origin=first.origin, lm=first.lm)]
    )
    assert routing_objective(obs, refused) > routing_objective(obs, rule)


def test_switching_off_an_lm_with_queued_work_is_estimated_worse(ctx: ClusterContext) -> None:
    node = ctx.node("worker-2")
    obs = NodeObservation(
        slot=0,
        epoch=0,
        node=node,
        services=ctx.services,
        roles=["lm3", "lm4"],
        state=NodeState(
            name="worker-2",
            backlog={"lm3": 4, "lm4": 4},
            free_cpu_cores=node.spec.cpu_cores,
            free_memory_gib=node.spec.memory_gib,
            free_vgpus=node.spec.total_vgpus,
            free_vram_gib=node.spec.total_vram_gib,
        ),
        tau_s=ctx.loop.tau_s,
        slot_s=ctx.loop.slot_s,
    )
    rule = rule_placement(obs)
    assert rule.by_lm()["lm4"].mode != "off"
    off = rule.model_copy(
        update={
            "lms": [
                p.model_copy(update={"mode": "off", "cpu_cores": 0, "vgpus": 0})
                if p.lm == "lm4"
                else p
                for p in rule.lms
            ]
        }
    )
    assert placement_objective(obs, off, ctx.loop.lam) > placement_objective(
        obs, rule, ctx.loop.lam
    )


def test_a_policy_piling_an_lm_on_one_node_is_estimated_worse(ctx: ClusterContext) -> None:
    traffic = {lm: 4000 for lm in ctx.lm_names}
    obs = PlanningObservation(epoch=1, context=ctx, traffic=traffic)
    rule = rule_macro_policy(obs, RulePlannerState())
    piled = rule.model_copy(
        update={
            "routing": [
                LMRouting(lm=r.lm, weights=[RouteWeight(node="worker-2", p=1.0)])
                for r in rule.routing
            ]
        }
    )
    assert macro_objective(obs, piled) > macro_objective(obs, rule)
    assert macro_objective(PlanningObservation(epoch=0, context=ctx), piled) == 0.0, (
        "no traffic yet: nothing to estimate"
    )


def test_choose_runs_the_llm_within_the_margin_and_the_rule_beyond() -> None:
    llm, rule = (
        MacroPolicy(routing=[], roles=[], rationale="llm"),
        MacroPolicy(routing=[], roles=[], rationale="rule"),
    )
    scores = {"llm": 0.30, "rule": 0.29}
    value, audit = choose(llm, rule, lambda v: scores[v.rationale], margin=0.02)
    assert value is llm and audit.chosen == "llm"
    scores["llm"] = 0.32
    value, audit = choose(llm, rule, lambda v: scores[v.rationale], margin=0.02)
    assert value is rule and audit.chosen == "rule" and "exceeds" in audit.reason
    assert {c.source: c.objective for c in audit.candidates} == {"llm": 0.32, "rule": 0.29}
