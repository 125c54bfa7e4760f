"""The run configuration: one model, the paper's defaults defined once, flag-named errors."""

from __future__ import annotations

import pytest

from lmedge.api.constants import EPOCH_SLOTS, LAMBDA, SLOT_S, TAU_S
from lmedge.api.observations import ClusterContext, NodeObservation
from lmedge.api.runconfig import PolicyConfig, RunConfig, parse_run_config
from lmedge.controller.assembly import PolicyChoice
from lmedge.errors import ConfigError
from lmedge.sim.scenario import LoopSpec

FLAGS = {"slot_s": "--slot-s", "tau_s": "--tau", "lam": "--lam", "epoch_slots": "--epoch-slots"}


def test_every_default_of_the_loop_constants_is_the_paper_constant() -> None:
    paper = {"slot_s": SLOT_S, "epoch_slots": EPOCH_SLOTS, "tau_s": TAU_S, "lam": LAMBDA}
    assert paper == {"slot_s": 30.0, "epoch_slots": 50, "tau_s": 900.0, "lam": 0.5}
    ctx = ClusterContext(nodes=[], services=[])
    spec = LoopSpec()
    assert RunConfig().loop_constants() == paper
    assert {k: getattr(ctx, k) for k in paper} == paper
    assert {k: getattr(spec, k) for k in paper} == paper
    fields = NodeObservation.model_fields
    assert (fields["tau_s"].default, fields["slot_s"].default) == (TAU_S, SLOT_S)


@pytest.mark.parametrize(
    ("data", "flag"),
    [
        ({"slot_s": float("nan")}, "--slot-s"),
        ({"slot_s": float("inf")}, "--slot-s"),
        ({"tau_s": 0}, "--tau"),
        ({"lam": 1.5}, "--lam"),
        ({"epoch_slots": 0}, "--epoch-slots"),
    ],
    ids=["slot-nan", "slot-inf", "tau-zero", "lam-above-one", "no-epoch"],
)
def test_a_bad_value_is_one_line_naming_the_flag(data: dict[str, float], flag: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_run_config(data, FLAGS)
    message = str(err.value)
    assert message.startswith(flag + ":") and "\n" not in message


def test_an_unknown_field_is_refused() -> None:
    with pytest.raises(ConfigError, match="slots"):
        parse_run_config({"slots": 3})


def test_the_policy_choice_round_trips_through_the_stored_config() -> None:
    choice = PolicyChoice("ma", router="rr", params={"deployer": {"alpha_default": "profile"}})
    config = RunConfig(tau_s=600, policy=choice.config(seed=7))
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
