"""The agentic router's admission control: default, what it refuses, what the LLM is told."""

from __future__ import annotations

import pytest

from lmedge.agents.rendering import describe_metrics, render_slot
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
    system, user = render_slot(ctx, 0, 0, macro, ranked, arrivals, reference, admit)
    pairs = next(x for x in user.splitlines() if x.startswith("Pairs to route"))
    if admit is None:
        assert "Admission control is off" in system and "->REJECT" not in pairs
    else:
        assert "Admission control is on" in system and "270 s" in system
        assert "worker-2/lm4(3)->REJECT" in pairs
    assert "$" not in system, "every template placeholder was filled"


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
