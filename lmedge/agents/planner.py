"""Planner `agentic`: the Global Planning Agent (paper §IV-A), once per epoch.

It reads o^G_e = (static context, episodic memory, last epoch's metrics,
previous policy) plus the random-baseline metrics, rendered as sentences, and
returns a `MacroPolicy`. The rule backend (rules/planner.py) runs every epoch
either way: its policy is the decision without an endpoint, and the reference
shown to the LLM with one. A failed LLM call falls back to the
rule's policy (the agent's own deterministic decision); the random baseline
(paper §V-D2) is the last resort when the rule fails too. A valid LLM policy
runs only if the scoring guard (guard.py) estimates it no worse than the
rule's by more than the margin.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from lmedge.agents.core import AgentCore
from lmedge.agents.guard import macro_objective
from lmedge.agents.memory import select_cases
from lmedge.agents.rendering import render_planning
from lmedge.agents.rules.planner import RulePlannerState, rule_macro_policy
from lmedge.api import (
    ClusterContext,
    Decision,
    MacroPolicy,
    PlanningObservation,
    check_macro_policy,
)
from lmedge.policies.random import random_macro_policy


class AgenticPlanner:
    """Tier 1: LLM planner with episodic memory; rule water-filling without an endpoint."""

    name = "agentic"

    def __init__(self, core: AgentCore, seed: int = 0) -> None:
        self.core = core
        self._state = RulePlannerState()
        self._rng = random.Random(seed)

    @classmethod
    def build(cls, ctx: ClusterContext, params: Mapping[str, Any], seed: int = 0) -> AgenticPlanner:
        return cls(AgentCore.from_params("planner", params, ctx.slot_s, cls.name), seed)

    def plan(self, obs: PlanningObservation) -> Decision[MacroPolicy]:
        ctx = obs.context
        reference = rule_macro_policy(obs, self._state)
        cases = select_cases(obs.memory, obs.traffic)
        return self.core.decide(
            model=MacroPolicy,
            schema_name="macro-policy",
            prompts=lambda: render_planning(obs, cases, reference),
            rule=lambda: reference,
            check=lambda v: [str(x) for x in check_macro_policy(v, ctx)],
            fallback=lambda: random_macro_policy(ctx, self._rng),
            score=lambda v: macro_objective(obs, v),
        )
