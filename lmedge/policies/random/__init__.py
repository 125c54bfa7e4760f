"""The random baselines: planner, router and deployer (paper §VI, RR)."""

from lmedge.policies.random.deployer import RandomDeployer
from lmedge.policies.random.planner import RandomPlanner, random_macro_policy
from lmedge.policies.random.router import RandomRequestRouter, RandomRouter

__all__ = [
    "RandomDeployer",
    "RandomPlanner",
    "RandomRequestRouter",
    "RandomRouter",
    "random_macro_policy",
]
