"""The run configuration: one model, the paper's defaults defined once, flag-named errors."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from lmedge.api.constants import EPOCH_SLOTS, LAMBDA, SLOT_S, TAU_S, LoopConstants
from lmedge.api.observations import ClusterContext, NodeObservation
from lmedge.api.runconfig import PolicyConfig, RunConfig, parse_run_config
from lmedge.controller.assembly import PolicyChoice
from lmedge.errors import ConfigError
from lmedge.sim.scenario import LoopSpec

FLAGS = {
    "loop.slot_s": "--slot-s",
    "loop.tau_s": "--tau",
    "loop.lam": "--lam",
    "loop.epoch_slots": "--epoch-slots",
}
PAPER = {"slot_s": 30.0, "epoch_slots": 50, "tau_s": 900.0, "lam": 0.5}


def test_every_default_of_the_loop_constants_is_the_paper_constant() -> None:
    assert {"slot_s": SLOT_S, "epoch_slots": EPOCH_SLOTS, "tau_s": TAU_S, "lam": LAMBDA} == PAPER
    assert LoopConstants().model_dump() == PAPER
    assert RunConfig().loop == LoopConstants()
    assert ClusterContext(nodes=[], services=[]).loop == LoopConstants()
    assert LoopSpec().constants == LoopConstants()
    fields = NodeObservation.model_fields
    assert (fields["tau_s"].default, fields["slot_s"].default) == (TAU_S, SLOT_S)


@pytest.mark.parametrize(
    "bad",
    [
        {"slot_s": 0},
        {"slot_s": float("inf")},
        {"epoch_slots": 0},
        {"tau_s": -1.0},
        {"tau_s": float("nan")},
        {"lam": -0.1},
        {"lam": 1.01},
    ],
    ids=[
        "slot-zero",
        "slot-inf",
        "epoch-zero",
        "tau-negative",
        "tau-nan",
        "lam-below",
        "lam-above",
    ],
)
def test_loop_constants_refuse_values_outside_their_range(bad: dict[str, float]) -> None:
    with pytest.raises(ValidationError) as err:
        LoopConstants.model_validate(bad)
    assert err.value.errors()[0]["loc"] == (next(iter(bad)),)


def test_loop_constants_are_frozen() -> None:
    loop = LoopConstants()
    with pytest.raises(ValidationError, match="frozen"):
        loop.tau_s = 1.0  # type: ignore[misc]


def test_the_scenario_loop_section_stays_flat_and_camel_case() -> None:
    spec = LoopSpec.model_validate(
        {"slotS": 2.0, "epochSlots": 4, "tauS": 60.0, "lam": 0.25, "slots": 9},
        strict=True,
        by_alias=True,
        by_name=False,
    )
    assert spec.slots == 9
    assert spec.constants == LoopConstants(slot_s=2.0, epoch_slots=4, tau_s=60.0, lam=0.25)
    assert type(spec.constants) is LoopConstants  # what a context holds: no `slots`


def test_a_run_stored_with_flat_constants_still_reads() -> None:
    # Runs stored before the constants were one value kept them beside `policy`.
    flat = {"slot_s": 2.0, "epoch_slots": 5, "tau_s": 120.0, "lam": 0.3, "policy": {"seed": 4}}
    config = RunConfig.model_validate(flat)
    assert config.loop == LoopConstants(slot_s=2.0, epoch_slots=5, tau_s=120.0, lam=0.3)
    assert config.policy.seed == 4
    assert config.model_dump()["loop"] == config.loop.model_dump()  # stored nested from now on


def test_constants_both_flat_and_nested_are_refused_by_name() -> None:
    with pytest.raises(ConfigError, match="tau_s: give the loop constants in `loop` only"):
        parse_run_config({"tau_s": 60.0, "loop": {"slot_s": 2.0}})


@pytest.mark.parametrize(
    ("data", "flag"),
    [
        ({"loop": {"slot_s": float("nan")}}, "--slot-s"),
        ({"loop": {"slot_s": float("inf")}}, "--slot-s"),
        ({"loop": {"tau_s": 0}}, "--tau"),
        ({"loop": {"lam": 1.5}}, "--lam"),
        ({"loop": {"epoch_slots": 0}}, "--epoch-slots"),
    ],
    ids=["slot-nan", "slot-inf", "tau-zero", "lam-above-one", "no-epoch"],
)
def test_a_bad_value_is_one_line_naming_the_flag(data: dict[str, Any], flag: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_run_config(data, FLAGS)
    message = str(err.value)
    assert message.startswith(flag + ":") and "\n" not in message


def test_an_unknown_field_is_refused() -> None:
    with pytest.raises(ConfigError, match="slots"):
        parse_run_config({"slots": 3})


def test_the_policy_choice_round_trips_through_the_stored_config() -> None:
    choice = PolicyChoice("ma", router="rr", params={"deployer": {"alpha_default": "profile"}})
    config = RunConfig(loop=LoopConstants(tau_s=600), policy=choice.config(seed=7))
    stored = RunConfig.model_validate_json(config.model_dump_json())
    back = PolicyChoice.of(stored.policy)
    assert back == choice
    assert stored.policy.seed == 7 and back.resolve() == choice.resolve()


def test_a_bad_profile_name_fails_when_the_config_is_built() -> None:
    with pytest.raises(ConfigError):
        PolicyChoice("no-such-profile").config()


def test_plugin_params_only_for_the_three_tiers() -> None:
    with pytest.raises(ValueError, match="scheduler"):
        PolicyConfig.model_validate({"params": {"scheduler": {"x": 1}}})
