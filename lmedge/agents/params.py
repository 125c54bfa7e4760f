"""The agentic plugins' parameters, typed like every other plugin's.

Each agentic plugin takes its own parameters (router: `admit_fraction`,
`prompt_form`; planner: `prompt_form`,
`follow_traffic`; deployer: `follow_modes`) and the LLM settings
of settings.py as `llm_<field>` or `llm_<agent>_<field>` keys. The LLM keys
are generated from `LLMSettings`, with its types and bounds, so a setting
has one schema whether it comes from a parameter or the environment, and a
bad value or an unknown key is one `ConfigError` naming the parameter when
the plugin is built (`parse_params`, as for every plugin).

It does not resolve the settings (environment, defaults, the slot's cap):
that is `settings.resolve_settings`, given `AgentParams.llm_settings()`.
Every plugin takes every agent's keys (`llm_planner_model` on the router is
accepted and left to the planner), as it always has.
"""

from __future__ import annotations

from typing import Annotated, Any, TypeVar

from pydantic import BeforeValidator, Field, ValidationInfo, create_model, field_validator
from pydantic.fields import FieldInfo
from pydantic_core import PydanticCustomError

from lmedge.agents.hierarchy import PromptForm
from lmedge.agents.rules.scheduler import ADMIT_FRACTION
from lmedge.agents.settings import SETTING_FIELDS, LLMSettings
from lmedge.policies.kit.params import PluginParams

P = TypeVar("P", bound="AgentParams")

_AGENTS = ("planner", "scheduler", "deployer")
#: Every LLM setting key a plugin takes, `llm_<field>` and `llm_<agent>_<field>`,
#: with the `LLMSettings` field it sets.
LLM_PARAM_KEYS: dict[str, str] = {
    key: f for f in SETTING_FIELDS for key in (f"llm_{f}", *(f"llm_{a}_{f}" for a in _AGENTS))
}


def _llm_fields() -> dict[str, Any]:
    """Each LLM key as an optional field, typed and bounded as its `LLMSettings` field."""
    out: dict[str, Any] = {}
    for key, f in LLM_PARAM_KEYS.items():
        info = LLMSettings.model_fields[f]
        annotation: Any = info.annotation
        out[key] = (annotation | None, FieldInfo.merge_field_infos(info, default=None))
    return out


def with_llm_keys(own: type[P]) -> type[P]:
    """Class decorator: `own` (a plugin's own parameters) plus every LLM setting key."""
    return create_model(own.__name__, __base__=own, __module__=own.__module__, **_llm_fields())


class AgentParams(PluginParams):
    """Base of the agentic plugins' parameter models (decorate with `with_llm_keys`)."""

    @field_validator("*", mode="before")
    @classmethod
    def _empty_llm_key_is_unset(cls, value: Any, info: ValidationInfo) -> Any:
        # "" leaves the setting to the environment and the defaults, as unset does
        return None if value == "" and info.field_name in LLM_PARAM_KEYS else value

    def llm_settings(self) -> dict[str, Any]:
        """The LLM setting keys given, for `resolve_settings`."""
        return self.model_dump(include=set(LLM_PARAM_KEYS), exclude_none=True)


def _admit_fraction(value: Any) -> float | None:
    """`off`/`none` -> None (admission control off); else a fraction in (0, 1]."""
    if value is None or (isinstance(value, str) and value.lower() in ("off", "none")):
        return None
    try:
        f = float(value)
    except (TypeError, ValueError):
        f = -1.0
    if not 0 < f <= 1:
        raise PydanticCustomError(
            "admit_fraction", "must be in (0, 1] or off, not {value}", {"value": repr(value)}
        )
    return f


def _lower(value: Any) -> Any:
    return "auto" if value is None else value.lower() if isinstance(value, str) else value


#: `prompt_form`: auto (flat while its prompt fits `hierarchy.PROMPT_TOKEN_LIMIT`),
#: flat or hierarchical (hierarchy.py); any case.
PromptFormParam = Annotated[PromptForm, BeforeValidator(_lower)]


@with_llm_keys
class PlannerParams(AgentParams):
    """Planner `agentic`."""

    prompt_form: PromptFormParam = Field(
        default="auto",
        description="flat: per-node weights and roles; hierarchical: a demand factor per LM.",
    )
    follow_traffic: bool = Field(
        default=False,
        description="Plan from the newest traffic: re-plan once the first traffic is seen, show"
        " a re-plan this epoch's traffic so far, give an LM applied since the last plan the"
        " average relative load, and guard the bottleneck on churn too (rules/planner.py);"
        " on in the ma profile only.",
    )


@with_llm_keys
class RouterParams(AgentParams):
    """Router `agentic`."""

    admit_fraction: Annotated[float | None, BeforeValidator(_admit_fraction)] = Field(
        default=ADMIT_FRACTION,
        description="Admission horizon as a fraction in (0, 1] of the LM's deadline; off admits"
        " every set (rules/scheduler.py).",
    )
    prompt_form: PromptFormParam = Field(
        default="auto",
        description="flat: a destination per pair; hierarchical: nodes to avoid per LM.",
    )


@with_llm_keys
class DeployerParams(AgentParams):
    """Deployer `agentic`."""

    follow_modes: bool = Field(
        default=False,
        description="Start each role LM in the mode the rule planner sized it for"
        " (NodeRole.modes) when open, as a preference (rules/deployer.py); off by default:"
        " measured, it does not help overall.",
    )
