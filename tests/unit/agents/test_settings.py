"""Per-agent LLM settings: precedence, slot caps, key files, bad values."""

from __future__ import annotations

from pathlib import Path

import pytest

from lmedge.agents.settings import AgentName, resolve_settings
from lmedge.errors import ConfigError

AGENTS: tuple[AgentName, ...] = ("planner", "scheduler", "deployer")


def test_unconfigured_by_default_and_empty_means_unset() -> None:
    s = resolve_settings("planner", {"llm_model": ""}, env={"LMEDGE_LLM_BASE_URL": ""})
    assert not s.configured
    assert s.model == "gpt-5"


def test_precedence_params_over_env_agent_over_generic() -> None:
    env = {
        "LMEDGE_LLM_MODEL": "env-generic",
        "LMEDGE_SCHEDULER_MODEL": "env-agent",
        "LMEDGE_LLM_BASE_URL": "http://env/v1",
    }
    assert resolve_settings("scheduler", {}, env=env).model == "env-agent"
    assert resolve_settings("deployer", {}, env=env).model == "env-generic"
    params = {"llm_model": "p-generic", "llm_deployer_model": "p-agent"}
    assert resolve_settings("scheduler", params, env=env).model == "p-generic"
    assert resolve_settings("deployer", params, env=env).model == "p-agent"
    assert resolve_settings("deployer", params, env=env).base_url == "http://env/v1"


def test_per_slot_agents_fit_in_half_a_slot() -> None:
    env = {"LMEDGE_LLM_TIMEOUT_S": "60", "LMEDGE_LLM_BUDGET_S": "90"}
    s = resolve_settings("deployer", {}, env=env, slot_s=10)
    assert s.budget_s == 5 and s.timeout_s == 5
    planner = resolve_settings("planner", {}, env=env, slot_s=10)
    assert planner.budget_s == 3 and planner.timeout_s == 3


@pytest.mark.parametrize("slot_s", [None, 30.0], ids=["defaults", "30-s-slot"])
def test_an_epoch_boundary_fits_in_one_slot(slot_s: float | None) -> None:
    # Planner, scheduler and deployers decide one after the other at an epoch
    # boundary; their budgets together must leave room in a 30-s slot.
    budgets = [resolve_settings(a, {}, env={}, slot_s=slot_s).budget_s for a in AGENTS]
    assert sum(budgets) < 30
    for a in AGENTS:
        s = resolve_settings(a, {}, env={}, slot_s=slot_s)
        assert s.timeout_s <= s.budget_s


def test_key_file(tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_text("sk-test\n")
    s = resolve_settings("planner", {"llm_api_key_file": str(key)}, env={})
    assert s.configured and s.key() == "sk-test"
    missing = resolve_settings("planner", {"llm_api_key_file": str(tmp_path / "nope")}, env={})
    with pytest.raises(ConfigError, match="cannot read the planner API key file"):
        missing.key()


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"llm_timeout_s": "-1"}, "timeout_s"),
        ({"llm_max_retries": "many"}, "max_retries"),
        ({"llm_budget_s": "0"}, "budget_s"),
    ],
    ids=["negative-timeout", "non-integer-retries", "zero-budget"],
)
def test_bad_values_are_one_line_config_errors(params: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        resolve_settings("scheduler", params, env={})
