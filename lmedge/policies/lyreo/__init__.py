"""LYREO: Lyapunov load-balanced routing over KV memory-time workload, with a learner seam."""

from lmedge.policies.lyreo.perrequest import (
    VARIANTS,
    LyreoRequestParams,
    LyreoRequestRouter,
    build_request_router,
)
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
    "VARIANTS",
    "Candidate",
    "LyreoLearner",
    "LyreoParams",
    "LyreoRequestParams",
    "LyreoRequestRouter",
    "LyreoRouter",
    "NoLearner",
    "build",
    "build_request_router",
    "memory_per_prompt",
    "workload",
]
