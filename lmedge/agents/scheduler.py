"""Router `agentic`: the Prompt Scheduling Agent (paper §IV-B1), every slot.

It reads the macro policy and the snapshot, rendered compactly (top-k
candidate destinations per LM with backlog, status and planner weight, then
the pairs to route with the rule's suggestion), and returns a `RoutingMap`.
Without an endpoint the rule backend (rules/scheduler.py) decides. A failed
LLM call falls back to the rule's routing; local routing (paper §V-D2) is
the last resort when the rule fails too. A valid LLM map runs only if the
scoring guard (guard.py) estimates it no worse than the rule's by more than
the margin.
A slot without arrivals needs no routing and costs no call.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lmedge.agents.core import AgentCore
from lmedge.agents.guard import routing_objective
from lmedge.agents.hierarchy import (
    PromptForm,
    avoid_format,
    choose_form,
    parse_form,
    render_slot_hierarchical,
)
from lmedge.agents.rendering import render_slot, routing_format
from lmedge.agents.rules.scheduler import ADMIT_FRACTION, Plan, candidates, rule_routing
from lmedge.api import ClusterContext, Decision, RoutingMap, SlotObservation, check_routing_map
from lmedge.errors import ConfigError
from lmedge.policies.local import local_routing


def parse_admit_fraction(value: Any) -> float | None:
    """`off`/`none` -> None (admission control off); else a fraction in (0, 1]."""
    if value is None or (isinstance(value, str) and value.lower() in ("off", "none")):
        return None
    try:
        f = float(value)
    except (TypeError, ValueError):
        f = -1.0
    if not 0 < f <= 1:
        raise ConfigError(f"router agentic: admit_fraction must be in (0, 1] or off, not {value!r}")
    return f


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
        """Parameter `admit_fraction` (default 0.3): a fraction in (0, 1] of the
        deadline; admission control rejects the sets that would finish later
        than that (see rules/scheduler.py). `off` admits every set.
        Parameter `prompt_form`: auto (default: flat while the prompt fits
        `hierarchy.PROMPT_TOKEN_LIMIT`), flat (a destination per pair) or
        hierarchical (nodes to avoid per LM, expanded by the rule; hierarchy.py)."""
        own = ("admit_fraction", "prompt_form")
        rest = {k: v for k, v in params.items() if k not in own}
        core = AgentCore.from_params("scheduler", rest, ctx.loop.slot_s, cls.name)
        return cls(
            core,
            parse_admit_fraction(params.get("admit_fraction", ADMIT_FRACTION)),
            parse_form("router", params.get("prompt_form")),
        )

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
            ranked = {lm: candidates(ctx, obs.macro, states, lm, plan=plan) for lm in lms}
            args = (ctx, obs.slot, obs.epoch, obs.macro, ranked, obs.arrivals, reference)
            flat = render_slot(*args, self.admit_fraction)
            if choose_form(self.prompt_form, flat) == "flat":
                prompts = lambda: flat  # noqa: E731
                fmt = lambda: routing_format(ranked, reference, admission)  # noqa: E731
            else:
                schema_name = "routing-avoid"
                hier = render_slot_hierarchical(*args, self.admit_fraction)
                prompts = lambda: hier  # noqa: E731
                fmt = lambda: avoid_format(  # noqa: E731
                    ctx, obs.macro, states, obs.arrivals, ranked, self.admit_fraction
                )
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
