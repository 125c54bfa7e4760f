"""Where each agent's LLM lives and how long it may take to answer.

Settings resolve per agent, first match wins:

1. `BuildContext.params` keys: `llm_<agent>_<field>` then `llm_<field>`
   (the CLI passes `--llm-base-url` etc. as `llm_base_url`, ...);
2. environment: `LMEDGE_<AGENT>_<FIELD>` then `LMEDGE_LLM_<FIELD>`
   (e.g. `LMEDGE_PLANNER_MODEL`, `LMEDGE_LLM_BASE_URL`);
3. the defaults below.

`<agent>` is `planner`, `scheduler` or `deployer`; `<field>` is `model`,
`base_url`, `api_key`, `api_key_file` (a path, e.g. a mounted Kubernetes
Secret), `timeout_s`, `budget_s`, `max_retries`, `guard` (the scoring guard
of scoring.py: on by default, `off`/`false` runs every valid LLM proposal) or
`guard_margin` (how much worse in estimated J than the rule a proposal may
be), `temperature` (default 0.2), `concurrency` (calls at once to the
endpoint; default: 1 for a server found to speak llama.cpp's dialect, else
unbounded) or `slot_cap` (`off` lifts the cap of the budgets at the slot:
for the emulator, whose time is virtual, so a slow CPU-hosted model is
judged on its decisions, never on a cluster). An agent uses its LLM only
when a base URL or an API key is configured; otherwise it runs its rule backend. Nothing here reads
`OPENAI_API_KEY`: an lmedge run never calls a paid endpoint unless it was
told to.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from lmedge.agents.scoring import GUARD_MARGIN
from lmedge.errors import ConfigError

AgentName = Literal["planner", "scheduler", "deployer"]

#: Defaults per agent. The paper uses a strong model for planning (GPT-5) and a
#: cheap one per slot (GPT-4); the time budgets keep every call inside a 30-s
#: slot: the scheduler must answer before routing starts and the deployers
#: after it (paper §V-D2 measured 2.7 s median / 4.5 s p95 for the scheduler).
#: At an epoch boundary the planner runs first, in the same slot, so the three
#: budgets add up: 9 + 12 + 6 = 27 s of a 30-s slot. (60 s x 2 used to stall the
#: loop for two minutes there.) A planner that needs longer can be given more,
#: but with a slot length known it is capped at `PLANNER_SLOT_SHARE` of it.
_DEFAULTS: dict[str, dict[str, Any]] = {
    "planner": {"model": "gpt-5", "timeout_s": 6.0, "budget_s": 9.0, "max_retries": 1},
    "scheduler": {"model": "gpt-4.1-mini", "timeout_s": 8.0, "budget_s": 12.0, "max_retries": 1},
    "deployer": {"model": "gpt-4.1-mini", "timeout_s": 4.0, "budget_s": 6.0, "max_retries": 1},
}

#: Share of a slot the planner may take at an epoch boundary when the slot
#: length is known: what is left of the slot after the per-slot agents' default
#: budgets (12 + 6 s of 30 s).
PLANNER_SLOT_SHARE = 0.3

#: Every setting an agent takes, as `llm_<field>` or `llm_<agent>_<field>` parameters.
SETTING_FIELDS = (
    "model",
    "base_url",
    "api_key",
    "api_key_file",
    "timeout_s",
    "budget_s",
    "max_retries",
    "guard",
    "guard_margin",
    "temperature",
    "concurrency",
    "slot_cap",
)


class LLMSettings(BaseModel):
    """One agent's endpoint and time budget."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    agent: AgentName
    model: str = Field(min_length=1, description="Model name sent to the endpoint.")
    base_url: str | None = Field(
        default=None, description="OpenAI-compatible base URL, e.g. http://vllm:8000/v1."
    )
    api_key: str | None = Field(default=None, repr=False, description="Bearer token.")
    api_key_file: Path | None = Field(
        default=None, description="File holding the key (a mounted Secret); read at startup."
    )
    timeout_s: float = Field(gt=0, le=600, description="Per HTTP attempt, seconds.")
    budget_s: float = Field(
        gt=0,
        le=3600,
        description="Whole decision incl. retries and one repair, seconds; kept within the slot.",
    )
    max_retries: int = Field(
        ge=0, le=5, description="Retries after timeouts, 429 and 5xx, inside budget_s."
    )
    temperature: float | None = Field(
        default=None, ge=0, le=2, description="Sampling temperature; unset: the client's 0.2."
    )
    concurrency: int | None = Field(
        default=None,
        ge=1,
        le=1024,
        description="Calls at once to the endpoint; unset: 1 for llama.cpp servers, else any.",
    )
    slot_cap: bool = Field(
        default=True,
        description="Cap budget_s at the agent's share of the slot (off: emulator runs only).",
    )
    guard: bool = Field(
        default=True,
        description="Run a valid LLM proposal only if its estimated objective is within "
        "guard_margin of the rule's (lmedge.agents.scoring).",
    )
    guard_margin: float = Field(
        default=GUARD_MARGIN,
        ge=0,
        le=1,
        description="Allowed excess of the LLM proposal's estimated objective over the rule's.",
    )

    @property
    def configured(self) -> bool:
        """True when an endpoint was given: the agent then asks the LLM."""
        return bool(self.base_url or self.api_key or self.api_key_file)

    def key(self) -> str:
        """The API key: `api_key`, else the file's content, else a placeholder.

        Local servers (vLLM, Ollama) accept any key; the SDK insists on one.
        """
        if self.api_key:
            return self.api_key
        if self.api_key_file is not None:
            try:
                return self.api_key_file.read_text().strip()
            except OSError as exc:
                raise ConfigError(
                    f"cannot read the {self.agent} API key file {self.api_key_file}: {exc.strerror}"
                ) from exc
        return "unused"


def resolve_settings(
    agent: AgentName,
    params: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    slot_s: float | None = None,
) -> LLMSettings:
    """Settings for one agent from params, then environment, then defaults.

    With `slot_s` (and `slot_cap` on), the per-slot agents' budget is capped at
    half a slot, the planner's at `PLANNER_SLOT_SHARE` of it, and the per-attempt timeout at the
    budget, so a slow endpoint can never push a decision past the slot
    boundary (the deployers run after the scheduler, which runs after the
    planner at an epoch boundary).
    """
    params = params or {}
    env = os.environ if env is None else env
    values: dict[str, Any] = {"agent": agent, **_DEFAULTS[agent]}
    for f in SETTING_FIELDS:
        for source, key in (
            (env, f"LMEDGE_LLM_{f.upper()}"),
            (env, f"LMEDGE_{agent.upper()}_{f.upper()}"),
            (params, f"llm_{f}"),
            (params, f"llm_{agent}_{f}"),
        ):
            v = source.get(key)
            if v is not None and v != "":
                values[f] = v
    try:
        s = LLMSettings.model_validate(values)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"])
        raise ConfigError(f"LLM setting {agent}.{field}: {err['msg']}") from exc
    if slot_s is not None and s.slot_cap:
        share = PLANNER_SLOT_SHARE if agent == "planner" else 0.5
        budget = min(s.budget_s, slot_s * share)
        s = s.model_copy(update={"budget_s": budget, "timeout_s": min(s.timeout_s, budget)})
    return s


AGENTIC = "agentic"


def agentic_params(
    tiers: Mapping[str, str],
    base_url: str | None = None,
    model: str | None = None,
    api_key: str | None = None,
) -> dict[str, dict[str, str]]:
    """Plugin parameters handing LLM settings to the tiers whose plugin is `agentic`.

    `tiers` maps "planner"/"router"/"deployer" to plugin names. Returns {} when
    no setting is given; raises `ConfigError` when settings are given but no
    tier is agentic (they would be silently ignored otherwise).
    """
    llm = {
        k: v
        for k, v in (("llm_base_url", base_url), ("llm_model", model), ("llm_api_key", api_key))
        if v
    }
    if not llm:
        return {}
    out = {tier: dict(llm) for tier, name in tiers.items() if name == AGENTIC}
    if not out:
        raise ConfigError(
            "--llm-* options need an agentic planner, router or deployer, e.g. --policy ma"
        )
    return out
