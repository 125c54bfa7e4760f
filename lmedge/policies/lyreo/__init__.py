"""LYREO: Lyapunov load-balanced routing over KV memory-time workload, with a learner seam."""

from lmedge.policies.lyreo.router import (
    NAME,
    Candidate,
    LyreoLearner,
    LyreoParams,
    LyreoRouter,
    NoLearner,
    build,
    memory_per_prompt,
    workload,
)

__all__ = [
    "NAME",
    "Candidate",
    "LyreoLearner",
    "LyreoParams",
    "LyreoRouter",
    "NoLearner",
    "build",
    "memory_per_prompt",
    "workload",
]
