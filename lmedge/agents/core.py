"""What the three agents share: ask the LLM or run the rule, and fill the audit.

An agent with an endpoint asks its LLM and returns

- `source="llm"` with the LLM's value when the reply parsed, with
  `validated=False` and the violations when `check` found it infeasible
  (the controller, the single place that enforces feasibility, replaces it);
- `source="fallback"`, `outcome="replaced"` with the paper's fallback value
  when the call failed or the reply never parsed: error, raw reply and
  tokens are kept for the audit.

Without an endpoint it returns the rule backend's value with `source="rule"`.
Either way the agent's own `check` runs so the audit records violations.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar, cast

from lmedge.agents.llm import LLMClient
from lmedge.agents.settings import AgentName, LLMSettings, resolve_settings
from lmedge.api import AgentKind, Decision, MacroPolicy, Placement, RoutingMap
from lmedge.errors import ConfigError

T = TypeVar("T", MacroPolicy, RoutingMap, Placement)

_SETTING_FIELDS = (
    "model",
    "base_url",
    "api_key",
    "api_key_file",
    "timeout_s",
    "budget_s",
    "max_retries",
)
_AGENTS = ("planner", "scheduler", "deployer")
#: Parameter keys an agentic plugin accepts (the CLI passes the same set to all three).
ALLOWED_PARAMS = frozenset(
    [f"llm_{f}" for f in _SETTING_FIELDS]
    + [f"llm_{a}_{f}" for a in _AGENTS for f in _SETTING_FIELDS]
)


def check_params(plugin: str, params: Mapping[str, Any]) -> None:
    """Reject parameters an agentic plugin does not know, naming the valid ones."""
    unknown = sorted(set(params) - ALLOWED_PARAMS)
    if unknown:
        raise ConfigError(
            f"{plugin}: unknown parameter(s) {', '.join(unknown)}; valid: llm_<field> or "
            f"llm_<agent>_<field> with field in {', '.join(_SETTING_FIELDS)}"
        )


class AgentCore:
    """One agent's LLM client (when configured) and its decision procedure."""

    def __init__(self, agent: AgentName, settings: LLMSettings, policy: str) -> None:
        self.agent: AgentKind = agent
        self.policy = policy
        self.settings = settings
        self.client = LLMClient(settings) if settings.configured else None

    @classmethod
    def from_params(
        cls, agent: AgentName, params: Mapping[str, Any], slot_s: float, policy: str
    ) -> AgentCore:
        check_params(f"{agent} {policy}", params)
        return cls(agent, resolve_settings(agent, params, slot_s=slot_s), policy)

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
        node: str | None = None,
    ) -> Decision[T]:
        """Ask the LLM (or run the rule) and wrap the result in an audited `Decision`."""
        if self.client is None:
            value = rule()
            violations = check(value)
            return _envelope(
                model,
                agent=self.agent,
                policy=self.policy,
                source="rule",
                value=value,
                node=node,
                validated=not violations,
                violations=violations,
            )
        system, user = prompts()
        reply = self.client.ask(system, user, model, schema_name, check)
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
        if reply.value is None:
            return _envelope(
                model,
                source="fallback",
                value=fallback(),
                parsed=False,
                validated=False,
                outcome="replaced",
                error=reply.error or "no usable reply",
                **common,
            )
        return _envelope(
            model,
            source="llm",
            value=reply.value,
            parsed=True,
            validated=not reply.violations,
            violations=reply.violations,
            **common,
        )


def _envelope(kind: type[T], /, **fields: Any) -> Decision[T]:
    """`Decision[kind](**fields)`, typed for the caller's T."""
    cls: Any = Decision[kind]  # type: ignore[valid-type]
    return cast("Decision[T]", cls(**fields))
