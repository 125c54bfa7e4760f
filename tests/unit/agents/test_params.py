"""The agentic plugins' typed parameters (lmedge.agents.params), built through the catalog."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from lmedge.api import ClusterContext
from lmedge.controller.catalog import BuildContext, build_deployer, build_planner, build_router
from lmedge.errors import ConfigError

BUILD: dict[str, Callable[[str, BuildContext], Any]] = {
    "planner": build_planner,
    "router": build_router,
    "deployer": build_deployer,
}


@pytest.mark.parametrize(
    ("tier", "params", "message"),
    [
        ("router", {"admit_fraction": "2"}, "admit_fraction: must be in (0, 1] or off, not '2'"),
        ("router", {"admit_fraction": "soon"}, "admit_fraction: must be in (0, 1] or off"),
        ("router", {"prompt_form": "tree"}, "prompt_form: Input should be 'auto', 'flat'"),
        ("planner", {"prompt_form": 3}, "prompt_form: Input should be 'auto', 'flat'"),
        ("planner", {"admit_fraction": 0.3}, "admit_fraction: Extra inputs are not permitted"),
        ("deployer", {"prompt_form": "flat"}, "prompt_form: Extra inputs are not permitted"),
        ("deployer", {"llm_baseurl": "http://x/v1"}, "llm_baseurl: Extra inputs are not permitted"),
        ("router", {"llm_timeout_s": "-1"}, "llm_timeout_s: Input should be greater than 0"),
        ("planner", {"llm_scheduler_max_retries": "many"}, "llm_scheduler_max_retries: Input"),
        ("deployer", {"llm_guard": "maybe"}, "llm_guard: Input should be a valid boolean"),
        ("deployer", {"follow_modes": "often"}, "follow_modes: Input should be a valid boolean"),
    ],
    ids=[
        "fraction-above-one",
        "fraction-not-a-number",
        "unknown-form",
        "form-not-a-name",
        "planner-has-no-admission",
        "deployer-has-no-form",
        "unknown-llm-key",
        "negative-timeout",
        "non-integer-retries",
        "guard-not-a-switch",
        "follow-modes-not-a-switch",
    ],
)
def test_a_bad_parameter_is_one_config_error_naming_it(
    ctx: ClusterContext, tier: str, params: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError) as err:
        BUILD[tier]("agentic", BuildContext(ctx, 0, params))
    text = str(err.value)
    assert text.startswith(f"invalid parameters for {tier} agentic: ")
    assert message in text and "\n" not in text


@pytest.mark.parametrize(
    ("params", "admit_fraction", "prompt_form"),
    [
        ({}, 0.3, "auto"),
        ({"admit_fraction": "OFF", "prompt_form": "Flat"}, None, "flat"),
        ({"admit_fraction": 0.15, "prompt_form": "hierarchical"}, 0.15, "hierarchical"),
        ({"admit_fraction": "1"}, 1.0, "auto"),
    ],
    ids=["defaults", "off-and-any-case", "typed-values", "string-number"],
)
def test_router_parameters(
    ctx: ClusterContext, params: dict[str, Any], admit_fraction: float | None, prompt_form: str
) -> None:
    router = build_router("agentic", BuildContext(ctx, 0, params))
    assert router.admit_fraction == admit_fraction  # type: ignore[attr-defined]
    assert router.prompt_form == prompt_form  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("params", "follow"), [({}, False), ({"follow_modes": "true"}, True)], ids=["off", "on"]
)
def test_deployer_parameters(ctx: ClusterContext, params: dict[str, Any], follow: bool) -> None:
    deployer = build_deployer("agentic", BuildContext(ctx, 0, params))
    assert deployer.follow_modes is follow  # type: ignore[attr-defined]


def test_llm_keys_reach_the_settings_of_their_agent_only(ctx: ClusterContext) -> None:
    """Every plugin takes every agent's keys; each agent reads the generic and its own."""
    params = {
        "llm_base_url": "http://127.0.0.1:9/v1",
        "llm_model": "generic",
        "llm_scheduler_model": "routing-model",
        "llm_timeout_s": "2.5",
        "llm_deployer_guard": "off",
        "llm_api_key": "",  # empty: unset, as in the environment
    }
    router = build_router("agentic", BuildContext(ctx, 0, params))
    planner = build_planner("agentic", BuildContext(ctx, 0, params))
    deployer = build_deployer("agentic", BuildContext(ctx, 0, params))
    s, p, d = (x.core.settings for x in (router, planner, deployer))  # type: ignore[attr-defined]
    assert (s.model, p.model, d.model) == ("routing-model", "generic", "generic")
    assert s.timeout_s == p.timeout_s == d.timeout_s == 2.5
    assert (s.guard, p.guard, d.guard) == (True, True, False)
    assert s.api_key is None and s.configured
