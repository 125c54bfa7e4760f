"""Training LYREO's learned scheduler in the emulator: episodes of the real control loop.

Each episode is one emulated run of the scenario (its own seed, derived from
the training seed), with the per-request LYREO router consulting the actor
for every request through its learner seam (`RolloutLearner`); after the episode the
trainer updates the networks (`lmedge.policies.lyreo.learning.ppo`) and the
next episode acts with the new actor. The result is a `PolicyFile`: the
actor's weights, the hyperparameters, the provenance and the training curve.

`evaluate` runs the same loop with a policy's argmax (or, with no policy,
with an untrained actor), so a curve point and an evaluation measure alike.
Validation (`LearnerParams.validate_every`, lmedge's addition): the argmax
is evaluated on the validation seeds before the first update and every few
episodes, and the file holds the checkpoint of lowest mean validation cost
(ties: the earlier), not necessarily the last; PPO's sampled policy can
improve while its argmax degrades, and this keeps the untrained residual
actor (the greedy) as the floor.
Not here: the networks and the updates (torch, `ppo`), the CLI (`lmedge.cli.train`).
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np

from lmedge.bench.runner import emulated_backend, settle_slots
from lmedge.controller.assembly import PolicyChoice, build_plugins, derive_seed
from lmedge.controller.loop import ControlLoop
from lmedge.errors import ConfigError
from lmedge.policies.lyreo import LyreoRequestParams, LyreoRequestRouter
from lmedge.policies.lyreo.learning import (
    FEATURES,
    Checkpoint,
    Episode,
    LearnerParams,
    NumpyActor,
    PolicyFile,
    Provenance,
    RolloutLearner,
)
from lmedge.policies.lyreo.learning.actor import Layer
from lmedge.sim import Scenario

#: The profile whose planner and deployer the episodes run with (its router is replaced):
#: LYREO's setting, every server running its model throughout.
BASE_PROFILE = "lyreo-ly"


def episode_seed(seed: int, episode: int) -> int:
    """The emulator seed of training episode `episode` (a held-out seed is any other)."""
    return derive_seed(seed, f"lyreo-train:{episode}")


def run_episode(
    scenario: Scenario, seed: int, learner: RolloutLearner, params: LearnerParams, slots: int
) -> None:
    """One emulated run of `slots` slots (and the settle slots) with `learner` deciding."""
    backend = emulated_backend(scenario, seed)
    ctx = backend.context()
    plugins = build_plugins(PolicyChoice(BASE_PROFILE), ctx, seed)
    router = LyreoRequestRouter(
        params.variant, LyreoRequestParams(nu=params.nu, epsilon=params.epsilon), learner
    )
    loop = ControlLoop(
        backend,
        replace(plugins, router=router),
        run_id=f"train-{scenario.name}-s{seed}",
        seed=seed,
        keep_decisions=False,
        keep_history=False,
    )
    loop.run(slots, settle_slots=settle_slots(ctx))


def _slots(scenario: Scenario, slots: int | None) -> int:
    n = slots if slots is not None else scenario.spec.loop.slots
    if n < 1:
        raise ConfigError(f"--slots must be at least 1, got {n}")
    return n


def evaluate(
    scenario: Scenario,
    seed: int,
    actor: NumpyActor,
    params: LearnerParams,
    slots: int | None = None,
) -> dict[str, float | int]:
    """The episode statistics of `actor`'s argmax on one run (`RolloutLearner.stats`)."""
    n = _slots(scenario, slots)
    learner = RolloutLearner(
        params, actor, np.random.default_rng(seed), sample=False, measured_slots=n
    )
    run_episode(scenario, seed, learner, params, n)
    return learner.stats()


def git_commit(where: Path) -> str:
    """The checkout's commit (with `+dirty` when it has changes), or 'unknown'."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=where, capture_output=True, text=True, timeout=5
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=where,
            capture_output=True,
            text=True,
            timeout=5,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    if head.returncode != 0:
        return "unknown"
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def train(
    scenario: Scenario,
    seed: int,
    episodes: int,
    params: LearnerParams,
    *,
    slots: int | None = None,
    on_episode: Callable[[Episode, PolicyFile], None] | None = None,
) -> PolicyFile:
    """Train for `episodes` episodes; the policy file of the selected actor, with its curve.

    The actor is the validation's best checkpoint (module docstring), or the
    last one when `params.validate_every` is 0.

    `on_episode(point, policy)` gets each curve point and the policy as it is
    after that episode's update (the CLI writes it, so a stopped training keeps
    its latest policy).

    Imports torch (the `lyreo` extra); without it a `ConfigError` says how to install it.
    """
    try:
        from lmedge.policies.lyreo.learning.ppo import Trainer
    except ImportError as exc:
        raise ConfigError(
            f"training LYREO needs torch ({exc}): install the extra, `pip install 'lmedge[lyreo]'`"
        ) from exc
    from lmedge import __version__

    if episodes < 0:
        raise ConfigError(f"--episodes must be at least 0, got {episodes}")
    n = _slots(scenario, slots)
    clash = sorted(set(params.validate_seeds) & {episode_seed(seed, k) for k in range(episodes)})
    if params.validate_every and clash:
        raise ConfigError(f"validate_seeds: {clash} are also training episode seeds")
    trainer = Trainer(params, seed)
    commit = git_commit(Path(__file__).resolve().parent)
    curve: list[Episode] = []
    checks: list[Checkpoint] = []
    best: tuple[float, int, list[Layer]] | None = None  # (validation cost, updates, layers)

    def validate() -> None:
        nonlocal best
        actor = trainer.actor()
        runs = [evaluate(scenario, v, actor, params, n) for v in params.validate_seeds]
        mean = {k: float(np.mean([r[k] for r in runs])) for k in runs[0]}
        checks.append(
            Checkpoint(
                episodes=len(curve),
                mean_latency_s=mean["mean_latency_s"],
                failure_share=mean["failure_share"],
                mean_z=mean["mean_z"],
                mean_cost=mean["mean_cost"],
            )
        )
        if best is None or mean["mean_cost"] < best[0]:
            best = (mean["mean_cost"], len(curve), trainer.net.numpy_layers())

    def policy() -> PolicyFile:
        selected, layers = (
            (best[1], best[2]) if best is not None else (len(curve), trainer.net.numpy_layers())
        )
        return PolicyFile(
            variant=params.variant,
            features=list(FEATURES),
            params=params,
            actor=layers,
            provenance=Provenance(
                scenario=scenario.name,
                seed=seed,
                episodes=len(curve),
                selected=selected,
                slots=n,
                commit=commit,
                lmedge_version=__version__,
            ),
            curve=list(curve),
            validation=list(checks),
        )

    validating = params.validate_every > 0 and bool(params.validate_seeds)
    if validating:
        validate()
    for k in range(episodes):
        s = episode_seed(seed, k)
        learner = RolloutLearner(
            params, trainer.actor(), np.random.default_rng(s), measured_slots=n
        )
        run_episode(scenario, s, learner, params, n)
        trainer.update(learner.trajectory())
        point = Episode(episode=k, seed=s, **learner.stats())
        curve.append(point)
        if validating and (len(curve) % params.validate_every == 0 or k == episodes - 1):
            validate()
        if on_episode is not None:
            on_episode(point, policy())
    return policy()
