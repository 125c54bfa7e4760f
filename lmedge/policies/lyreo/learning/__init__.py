"""LYREO's learned scheduler: features, the numpy actor and its policy file, rollouts, PPO.

Deciding with a trained policy (`ActorLearner`, `load_policy`) needs numpy
only; `ppo` (training) imports torch, the `lyreo` extra, and is imported by
`lmedge train lyreo` alone.
"""

from lmedge.policies.lyreo.learning.actor import (
    FORMAT,
    ActorLearner,
    CandidateScorer,
    Checkpoint,
    Episode,
    NumpyActor,
    PolicyFile,
    Provenance,
    load_policy,
    save_policy,
    shipped_policy,
)
from lmedge.policies.lyreo.learning.features import FEATURES, request_rows
from lmedge.policies.lyreo.learning.params import LearnerParams, Variant
from lmedge.policies.lyreo.learning.rollout import RolloutLearner, Trajectory

__all__ = [
    "FEATURES",
    "FORMAT",
    "ActorLearner",
    "CandidateScorer",
    "Checkpoint",
    "Episode",
    "LearnerParams",
    "NumpyActor",
    "PolicyFile",
    "Provenance",
    "RolloutLearner",
    "Trajectory",
    "Variant",
    "load_policy",
    "request_rows",
    "save_policy",
    "shipped_policy",
]
