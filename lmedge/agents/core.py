"""What the three agents share: ask the LLM or run the rule, and fill the audit.

An agent with an endpoint asks its LLM and returns

- `source="llm"` with the LLM's value when the reply parsed, passed `check`
  and the scoring guard (scoring.py) estimated it no worse than the rule's
  decision by more than the margin; `Decision.guard` holds both estimates;
- `source="rule"`, `outcome="replaced"` with the rule's value when the
  guard judged the valid LLM proposal worse (both estimates in the audit);
- `source="fallback"`, `outcome="replaced"` with the rule's value when the
  call failed, the reply never parsed or stayed infeasible after the
  client's repair turn: error, violations, raw reply and tokens are kept.
  The agent's own rule is the fallback of an LLM agent, never "keep what
  runs" (on a cold start that keeps every node empty); only when the rule
  raises too does the paper's last resort (`fallback`) run.

Without an endpoint it returns the rule backend's value with `source="rule"`,
unchecked here: every decision reaches the cluster through the decision
guard (`lmedge.controller.guard`, in the control loop and in the node
agent), which validates it and records the violations. At 1,000 nodes a
second check of a rule value cost ~70 ms a slot. The LLM path keeps its own
`check`, which drives the repair turn and the fallback.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar, cast

from lmedge.agents.llm import LLMClient, ReplyFormat
from lmedge.agents.params import AgentParams
from lmedge.agents.scoring import choose
from lmedge.agents.settings import AgentName, LLMSettings, resolve_settings
from lmedge.api import AgentKind, Decision, MacroPolicy, Placement, RoutingMap
from lmedge.api.decisions import cap_text

log = logging.getLogger(__name__)

T = TypeVar("T", MacroPolicy, RoutingMap, Placement)


class AgentCore:
    """One agent's LLM client (when configured) and its decision procedure."""

    def __init__(self, agent: AgentName, settings: LLMSettings, policy: str) -> None:
        self.agent: AgentKind = agent
        self.policy = policy
        self.settings = settings
        self.client = LLMClient(settings) if settings.configured else None

    @classmethod
    def from_params(
        cls, agent: AgentName, params: AgentParams, slot_s: float, policy: str
    ) -> AgentCore:
        """The agent's core with the LLM settings its plugin's parameters give (settings.py)."""
        return cls(agent, resolve_settings(agent, params.llm_settings(), slot_s=slot_s), policy)

    @property
    def uses_llm(self) -> bool:
        return self.client is not None

    def close(self) -> None:
        if self.client is not None:
            self.client.close()

    def decide(
        self,
        *,
        model: type[T],
        schema_name: str,
        prompts: Callable[[], tuple[str, str]],
        rule: Callable[[], T],
        check: Callable[[T], list[str]],
        fallback: Callable[[], T],
        score: Callable[[T], float] | None = None,
        node: str | None = None,
        reply_format: Callable[[], ReplyFormat[T]] | None = None,
    ) -> Decision[T]:
        """Ask the LLM (or run the rule) and wrap the result in an audited `Decision`.

        With an LLM: a failed call or an unparsable reply runs the rule
        (`source="fallback"`, the error kept); a reply still infeasible after
        the client's repair turn runs the rule too (its violations kept); a
        valid reply goes through the scoring guard (`score`, when the guard is
        on) and runs only if it is estimated no worse than the rule's decision
        by more than the margin. Only when the rule itself raises does the
        agent use `fallback`, the paper's last resort.
        """
        if self.client is None:
            return _envelope(
                model, agent=self.agent, policy=self.policy, source="rule", value=rule(), node=node
            )
        system, user = prompts()
        # The agent's observation-specific schema, token bound and expander (llm.ReplyFormat).
        fmt = reply_format() if reply_format is not None else None
        reply = self.client.ask(system, user, model, schema_name, check, fmt)
        common: dict[str, Any] = {
            "agent": self.agent,
            "policy": self.policy,
            "node": node,
            "raw": reply.raw,
            "latency_s": reply.latency_s,
            "tokens_in": reply.tokens_in,
            "tokens_out": reply.tokens_out,
            "model": reply.model,
        }
        if reply.value is None or reply.violations:
            value, error = self._rule_or_last_resort(rule, fallback)
            if reply.value is None:
                error = "; ".join(e for e in (reply.error or "no usable reply", error) if e)
            return _envelope(
                model,
                source="fallback",
                value=value,
                parsed=reply.value is not None,
                validated=False,
                outcome="replaced",
                violations=reply.violations,
                error=error,
                **common,
            )
        if score is None or not self.settings.guard:
            return _envelope(model, source="llm", value=reply.value, parsed=True, **common)
        try:
            reference = rule()
            chosen, audit = choose(reply.value, reference, score, self.settings.guard_margin)
        except Exception as exc:  # no estimate, no judgement: the LLM's valid value runs
            log.exception("%s %s: the scoring guard failed", self.agent, self.policy)
            return _envelope(
                model,
                source="llm",
                value=reply.value,
                parsed=True,
                error=cap_text(f"guard failed: {type(exc).__name__}: {exc}"),
                **common,
            )
        if audit.chosen == "llm":
            return _envelope(model, source="llm", value=chosen, parsed=True, guard=audit, **common)
        return _envelope(
            model,
            source="rule",
            value=chosen,
            parsed=True,
            outcome="replaced",
            guard=audit,
            **common,
        )

    def _rule_or_last_resort(
        self, rule: Callable[[], T], fallback: Callable[[], T]
    ) -> tuple[T, str | None]:
        """The rule's value; the last resort (with why) when the rule raises too."""
        try:
            return rule(), None
        except Exception as exc:  # the rule is a bug here; the last resort cannot fail
            log.exception("%s %s: the rule fallback failed", self.agent, self.policy)
            return fallback(), cap_text(f"rule fallback failed: {type(exc).__name__}: {exc}")


def _envelope(kind: type[T], /, **fields: Any) -> Decision[T]:
    """`Decision[kind](**fields)`, typed for the caller's T."""
    cls: Any = Decision[kind]  # type: ignore[valid-type]
    return cast("Decision[T]", cls(**fields))
