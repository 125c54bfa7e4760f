"""Router `agentic`: the Prompt Scheduling Agent (paper §IV-B1), every slot.

It reads the macro policy and the snapshot, rendered compactly (top-k
candidate destinations per LM with backlog, status and planner weight, then
the pairs to route with the rule's suggestion), and returns a `RoutingMap`.
Without an endpoint the rule backend (rules/scheduler.py) decides. A failed
LLM call falls back to the rule's routing; local routing (paper §V-D2) is
the last resort when the rule fails too. A valid LLM map runs only if the
scoring guard (scoring.py) estimates it no worse than the rule's by more than
the margin.
A slot without arrivals needs no routing and costs no call.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lmedge.agents.core import AgentCore
from lmedge.agents.hierarchy import (
    PromptForm,
    avoid_format,
    choose_form,
    render_slot_hierarchical,
)
from lmedge.agents.params import RouterParams
from lmedge.agents.rendering import SlotView, render_slot, routing_format
from lmedge.agents.rules.scheduler import ADMIT_FRACTION, Plan, candidates, rule_routing
from lmedge.agents.scoring import routing_objective
from lmedge.api import ClusterContext, Decision, RoutingMap, SlotObservation, check_routing_map
from lmedge.policies.kit.params import parse_params
from lmedge.policies.local import local_routing


class AgenticRouter:
    """Tier 2: LLM prompt scheduler; rule earliest-completion routing without an endpoint."""

    name = "agentic"

    def __init__(
        self,
        core: AgentCore,
        admit_fraction: float | None = ADMIT_FRACTION,
        prompt_form: PromptForm = "auto",
    ) -> None:
        self.core = core
        self.admit_fraction = admit_fraction
        self.prompt_form = prompt_form

    @classmethod
    def build(cls, ctx: ClusterContext, params: Mapping[str, Any]) -> AgenticRouter:
        """Parameters: `RouterParams` (params.py): `admit_fraction` (default 0.3, a
        fraction in (0, 1] of the LM's deadline, or `off`; rules/scheduler.py),
        `prompt_form` and the LLM settings; a bad one is a `ConfigError` naming it."""
        p = parse_params(RouterParams, params, f"router {cls.name}")
        core = AgentCore.from_params("scheduler", p, ctx.loop.slot_s, cls.name)
        return cls(core, p.admit_fraction, p.prompt_form)

    def route(self, obs: SlotObservation) -> Decision[RoutingMap]:
        ctx = obs.context
        states = {n.name: n for n in obs.snapshot.nodes}
        reference = rule_routing(ctx, obs.macro, states, obs.arrivals, self.admit_fraction)

        if not reference.routes and not reference.rejections:
            return Decision[RoutingMap](
                agent="scheduler", policy=self.name, source="rule", value=reference
            )
        admission = self.admit_fraction is not None
        schema_name, prompts, fmt = "routing-map", lambda: ("", ""), None
        if self.core.uses_llm:
            lms = sorted({a.lm for a in obs.arrivals if a.requests > 0 and ctx.has_service(a.lm)})
            plan = Plan.of(ctx, obs.macro)
            view = SlotView(
                ctx, obs.slot, obs.epoch, obs.macro, states, obs.arrivals, reference,
                ranked={lm: candidates(ctx, obs.macro, states, lm, plan=plan) for lm in lms},
                admit_fraction=self.admit_fraction,
            )  # fmt: skip
            flat = render_slot(view)
            if choose_form(self.prompt_form, flat) == "flat":
                prompts = lambda: flat  # noqa: E731
                fmt = lambda: routing_format(view)  # noqa: E731
            else:
                schema_name = "routing-avoid"
                hier = render_slot_hierarchical(view)
                prompts = lambda: hier  # noqa: E731
                fmt = lambda: avoid_format(view)  # noqa: E731
        return self.core.decide(
            model=RoutingMap,
            schema_name=schema_name,
            prompts=prompts,
            reply_format=fmt,
            rule=lambda: reference,
            check=lambda v: [
                str(x) for x in check_routing_map(v, ctx, obs.arrivals, allow_rejections=admission)
            ],
            # local routing serves every pair: a failed call never refuses anyone
            fallback=lambda: local_routing(ctx, obs.arrivals),
            score=lambda v: routing_objective(obs, v),
        )
