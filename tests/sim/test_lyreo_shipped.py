"""The LYREO policies shipped in the package: they load, and `lyreo` beats its Lyapunov half.

`lmedge/policies/lyreo/trained/README.md` reports the shipped `lyreo` below
`lyreo-ly` in mean latency and load deviation on seeds 11, 12 (which chose
the checkpoint) and 13 (which did not); this holds the claim on seed 13.
Deciding needs no torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from lmedge.bench.runner import RunSpec, run
from lmedge.controller.assembly import PolicyChoice
from lmedge.policies.lyreo.learned import build_learned
from lmedge.policies.lyreo.learning import ActorLearner, Variant, load_policy, shipped_policy

LYREO = Path(__file__).resolve().parents[2] / "examples" / "lyreo"


@pytest.mark.parametrize("variant", ["lyreo", "ly-ppo", "ppo-fixed"], ids=str)
def test_each_variant_ships_a_policy_trained_on_examples_lyreo(variant: Variant) -> None:
    policy = load_policy(shipped_policy(variant))
    assert policy.variant == variant
    assert policy.provenance.scenario == "lyreo" and policy.provenance.episodes == 30
    assert policy.provenance.selected in {c.episodes for c in policy.validation}
    assert isinstance(build_learned({}, variant).learner, ActorLearner)


def _balance(profile: str) -> dict[str, Any]:
    spec = RunSpec(LYREO, PolicyChoice(profile=profile), seed=13, slots=100)
    balance: dict[str, Any] = run(spec).summary["balance"]
    return balance


@pytest.mark.slow
def test_the_shipped_lyreo_beats_lyreo_ly_on_a_seed_no_choice_saw() -> None:
    learned, greedy = _balance("lyreo"), _balance("lyreo-ly")
    assert learned["mean_latency_s"] < greedy["mean_latency_s"]
    assert learned["mean_deviation"] < greedy["mean_deviation"]
