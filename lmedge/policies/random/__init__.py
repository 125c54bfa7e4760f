"""The random baselines: planner, router and deployer (paper §VI, RR)."""

from lmedge.policies.random.deployer import RandomDeployer
from lmedge.policies.random.planner import RandomPlanner, random_macro_policy
from lmedge.policies.random.router import RandomRequestRouter, RandomRouter, build_request

__all__ = [
    "RandomDeployer",
    "RandomPlanner",
    "RandomRequestRouter",
    "RandomRouter",
    "build_request",
    "random_macro_policy",
]
