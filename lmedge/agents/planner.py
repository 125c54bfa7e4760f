"""Planner `agentic`: the Global Planning Agent (paper §IV-A), once per epoch.

It reads o^G_e = (static context, episodic memory, last epoch's metrics,
previous policy) plus the random-baseline metrics, rendered as sentences, and
returns a `MacroPolicy`. The rule backend (rules/planner.py) runs every epoch
either way: its policy is the decision without an endpoint, and the reference
shown to the LLM with one. A failed LLM call falls back to the
rule's policy (the agent's own deterministic decision); the random baseline
(paper §V-D2) is the last resort when the rule fails too. A valid LLM policy
runs only if the scoring guard (scoring.py) estimates it no worse than the
rule's by more than the margin.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from lmedge.agents.core import AgentCore
from lmedge.agents.hierarchy import (
    PromptForm,
    choose_form,
    demand_format,
    render_planning_hierarchical,
)
from lmedge.agents.memory import select_cases
from lmedge.agents.params import PlannerParams
from lmedge.agents.rendering import policy_format, render_planning
from lmedge.agents.rules.planner import RulePlannerState, rule_macro_policy
from lmedge.agents.scoring import macro_objective
from lmedge.api import (
    Capabilities,
    ClusterContext,
    Decision,
    MacroPolicy,
    PlanningObservation,
    check_macro_policy,
)
from lmedge.policies.kit.params import parse_params
from lmedge.policies.random import random_macro_policy


class AgenticPlanner:
    """Tier 1: LLM planner with episodic memory; rule water-filling without an endpoint."""

    name = "agentic"

    def __init__(
        self,
        core: AgentCore,
        seed: int = 0,
        prompt_form: PromptForm = "auto",
        *,
        follow_traffic: bool = False,
    ) -> None:
        self.core = core
        # only the LLM's prompt shows the random baseline; the rule ignores it
        self.capabilities = Capabilities(reads_baseline=core.uses_llm, reads_traffic=follow_traffic)
        self.prompt_form = prompt_form
        self._state = RulePlannerState(follow_traffic=follow_traffic)
        self._rng = random.Random(seed)

    @classmethod
    def build(cls, ctx: ClusterContext, params: Mapping[str, Any], seed: int = 0) -> AgenticPlanner:
        """Parameters: `PlannerParams` (params.py); a bad one is a `ConfigError` naming it."""
        p = parse_params(PlannerParams, params, f"planner {cls.name}")
        core = AgentCore.from_params("planner", p, ctx.loop.slot_s, cls.name)
        return cls(core, seed, p.prompt_form, follow_traffic=p.follow_traffic)

    def plan(self, obs: PlanningObservation) -> Decision[MacroPolicy]:
        ctx = obs.context
        reference = rule_macro_policy(obs, self._state)
        cases = select_cases(obs.memory, obs.traffic)
        flat = render_planning(obs, cases, reference) if self.core.uses_llm else ("", "")
        if choose_form(self.prompt_form, flat) == "flat":
            schema_name, prompts = "macro-policy", lambda: flat
            fmt = lambda: policy_format(ctx, reference)  # noqa: E731
        else:
            schema_name = "demand-factors"
            prompts = lambda: render_planning_hierarchical(obs, cases)  # noqa: E731
            fmt = lambda: demand_format(obs, self._state)  # noqa: E731
        return self.core.decide(
            model=MacroPolicy,
            schema_name=schema_name,
            prompts=prompts,
            reply_format=fmt,
            rule=lambda: reference,
            check=lambda v: [str(x) for x in check_macro_policy(v, ctx)],
            fallback=lambda: random_macro_policy(ctx, self._rng),
            score=lambda v: macro_objective(obs, v),
        )
