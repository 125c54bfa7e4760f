"""Training LYREO's scheduler in the emulator improves on its starting point (CI-sized).

A few short episodes of `examples/lyreo` (LYREO's setting: 8 heterogeneous
GPUs, a request per user per slot, routed per request). The first test
trains an actor from scratch (not residual): the untrained one routes by a
near-arbitrary fixed preference;
what training guarantees, on a task with this clear a signal (a candidate's
estimated latency is a feature), is that the trained actor does better on a
seed it never trained on. The second checks the validation that picks the
shipped checkpoint of a residual actor. Everything is seeded (emulator, sampling, torch on
one thread), so the run is the same on any machine.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lmedge.policies.lyreo.learning import LearnerParams, NumpyActor
from lmedge.sim import load_scenario

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
HELD_OUT = 999_999


@pytest.mark.slow
def test_training_improves_on_the_untrained_actor_on_a_held_out_seed() -> None:
    from lmedge.bench.training import episode_seed, evaluate, train
    from lmedge.policies.lyreo.learning.ppo import Trainer

    scenario = load_scenario(ROOT / "examples" / "lyreo")
    params = LearnerParams(lr=3e-3, horizon=100, residual=False, validate_every=0)
    slots, episodes = 40, 6
    assert HELD_OUT not in {episode_seed(1, k) for k in range(episodes)}
    before = evaluate(scenario, HELD_OUT, Trainer(params, 1).actor(), params, slots)
    policy = train(scenario, 1, episodes, params, slots=slots)
    after = evaluate(scenario, HELD_OUT, NumpyActor.of(policy), params, slots)
    assert [p.episode for p in policy.curve] == list(range(episodes))
    assert after["mean_cost"] < before["mean_cost"]
    assert after["failure_share"] < before["failure_share"]
    assert after["mean_latency_s"] < before["mean_latency_s"]


@pytest.mark.slow
def test_the_file_holds_the_validations_best_checkpoint() -> None:
    from lmedge.bench.training import evaluate, train

    scenario = load_scenario(ROOT / "examples" / "lyreo")
    # a large learning rate, so that the checkpoints differ after so few slots
    params = LearnerParams(lr=3e-2, horizon=50, validate_every=1, validate_seeds=(HELD_OUT,))
    policy = train(scenario, 1, 2, params, slots=10)
    costs = {c.episodes: c.mean_cost for c in policy.validation}
    assert list(costs) == [0, 1, 2]  # the untrained actor, then after each episode
    assert policy.provenance.selected == min(costs, key=lambda k: (costs[k], k))
    again = evaluate(scenario, HELD_OUT, NumpyActor.of(policy), params, 10)
    assert again["mean_cost"] == costs[policy.provenance.selected]
