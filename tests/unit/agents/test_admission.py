"""The agentic router's admission control: default, what it refuses, what the LLM is told."""

from __future__ import annotations

import re
from typing import Any

import pytest

from lmedge.agents.hierarchy import render_slot_hierarchical
from lmedge.agents.rendering import SlotView, describe_metrics, render_slot
from lmedge.agents.rules.planner import plan_macro
from lmedge.agents.rules.scheduler import ADMIT_FRACTION, candidates, rule_routing
from lmedge.agents.scheduler import AgenticRouter
from lmedge.api import Arrival, ClusterContext, EpochMetrics, LMStats, NodeState, check_routing_map


def _states(ctx: ClusterContext, backlog: dict[str, int]) -> dict[str, NodeState]:
    return {n.name: NodeState(name=n.name, backlog=dict(backlog)) for n in ctx.workers}


def test_admission_is_on_by_default_at_three_tenths(ctx: ClusterContext) -> None:
    assert ADMIT_FRACTION == 0.3
    assert AgenticRouter.build(ctx, {}).admit_fraction == 0.3


def test_only_the_lm_whose_queues_are_too_long_is_refused(ctx: ClusterContext) -> None:
    """lm4 queues hold hours of work everywhere; the text LMs' are empty."""
    macro = plan_macro(ctx, {}, {})
    arrivals = [
        Arrival(origin=n.name, lm=lm, requests=1, prompts=4)
        for n in ctx.workers
        for lm in ctx.lm_names
    ]
    routing = rule_routing(ctx, macro, _states(ctx, {"lm4": 2000}), arrivals, admit_fraction=0.3)
    assert check_routing_map(routing, ctx, arrivals) == []
    assert {lm for _, lm in routing.rejected()} == {"lm4"}
    assert {r.lm for r in routing.routes} == {"lm1", "lm2", "lm3"}
    assert len(routing.routes) + len(routing.rejections) == len(arrivals)


@pytest.mark.parametrize("admit", [None, 0.3], ids=["off", "on"])
def test_the_prompt_says_whether_rejecting_is_allowed(
    ctx: ClusterContext, admit: float | None
) -> None:
    macro = plan_macro(ctx, {}, {})
    states = _states(ctx, {"lm4": 2000})
    arrivals = [Arrival(origin="worker-2", lm=lm, requests=1, prompts=3) for lm in ("lm1", "lm4")]
    reference = rule_routing(ctx, macro, states, arrivals, admit_fraction=admit)
    ranked = {lm: candidates(ctx, macro, states, lm) for lm in ("lm1", "lm4")}
    system, user = render_slot(
        SlotView(ctx, 0, 0, macro, states, arrivals, reference, ranked, admit)
    )
    pairs = next(x for x in user.splitlines() if x.startswith("Pairs to route"))
    if admit is None:
        assert "Admission control is off" in system and "->REJECT" not in pairs
    else:
        assert "Admission control is on" in system and "270 s" in system
        assert "worker-2/lm4(3)->REJECT" in pairs
    assert "$" not in system, "every template placeholder was filled"


def _with_deadline(ctx: ClusterContext, lm: str, deadline_s: float) -> ClusterContext:
    """`ctx` with `lm`'s LMService given its own deadline (the others keep tau)."""
    services = [
        s.model_copy(update={"spec": s.spec.model_copy(update={"deadline_s": deadline_s})})
        if s.name == lm
        else s
        for s in ctx.services
    ]
    fields = {k: getattr(ctx, k) for k in ClusterContext.model_fields}
    return ClusterContext(**{**fields, "services": services})


@pytest.mark.parametrize("render", [render_slot, render_slot_hierarchical], ids=["flat", "hier"])
@pytest.mark.parametrize("margin_s", [-10.0, 10.0], ids=["estimate-past-it", "estimate-within"])
def test_the_prompt_states_the_cutoff_the_rule_applies_to_an_lm_with_its_own_deadline(
    ctx: ClusterContext, render: Any, margin_s: float
) -> None:
    """lm4's own deadline puts its cut-off `margin_s` from the best estimate of a set;
    tau's cut-off (0.3 x 900 = 270 s) would admit the set either way."""
    fraction, origin = 0.3, "worker-2"
    macro = plan_macro(ctx, {}, {})
    states = _states(ctx, {"lm4": 5})
    arrivals = [Arrival(origin=origin, lm="lm4", requests=1, prompts=3)]
    best = candidates(ctx, macro, states, "lm4", prompts=3, origin=origin)[0]
    assert best.backlog > 0 and best.cost_s + 10 < fraction * ctx.loop.tau_s
    own = _with_deadline(ctx, "lm4", (best.cost_s + margin_s) / fraction)

    reference = rule_routing(own, macro, states, arrivals, admit_fraction=fraction)
    ranked = {"lm4": candidates(own, macro, states, "lm4")}
    system, _ = render(SlotView(own, 0, 0, macro, states, arrivals, reference, ranked, fraction))

    stated = re.search(r"\blm4 ([0-9.]+) s\b", system)
    assert stated is not None, system
    cutoff = float(stated.group(1))
    assert cutoff == pytest.approx(fraction * own.deadline_s("lm4"), rel=1e-5)
    assert "lm1 270 s" in system, "the LMs without a deadline of their own keep tau's"
    refused = [r.lm for r in reference.rejections]
    assert refused == (["lm4"] if best.cost_s > cutoff else []), "the rule refuses by that cut-off"
    assert (margin_s < 0) == bool(refused)


def test_the_planner_is_told_how_many_were_refused() -> None:
    stats = LMStats(lm="lm4", arrivals=10, successes=5, success_ratio=0.5, mean_latency_s=90.0)
    m = EpochMetrics(
        per_lm=[stats], requests=10, successes=5, rejected=4, mean_latency_s=90.0,
        jain=1.0, f_norm=1.0, t_norm=0.1, objective=0.05,
    )  # fmt: skip
    assert "(5/10 requests served, 4 refused at once by admission control)" in describe_metrics(
        m, "In the last epoch"
    )
    quiet = describe_metrics(m.model_copy(update={"rejected": 0}), "In the last epoch")
    assert "(5/10 requests served)" in quiet and "refused" not in quiet


def test_the_scheduler_and_deployer_prompts_state_each_lms_own_deadline(
    ctx: ClusterContext,
) -> None:
    """With one deadline the prompts say tau; with an LMService's own, each LM's."""
    from lmedge.agents.rendering import render_node, scheduler_system
    from lmedge.agents.rules.deployer import rule_placement
    from lmedge.api import NodeObservation

    assert "Requests time out after 900 s." in scheduler_system(ctx, 0.3, "")
    own = _with_deadline(ctx, "lm4", 600.0)
    system = scheduler_system(own, 0.3, "")
    assert "lm1 at 900 s" in system and "lm4 at 600 s" in system
    node = own.node("worker-2")
    obs = NodeObservation(
        slot=0, epoch=0, node=node, services=own.services, state=NodeState(name=node.name),
        roles=[], slot_s=own.loop.slot_s, tau_s=own.loop.tau_s,
    )  # fmt: skip
    deployer_system, _ = render_node(obs, rule_placement(obs))
    assert "lm4 at 600 s" in deployer_system and "lm2 at 900 s" in deployer_system
