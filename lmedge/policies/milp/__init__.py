"""The MILP joint routing + activation baseline (`milp` router and deployer)."""

from lmedge.policies.milp.model import Solution, SurrogateWeights, solve_slot
from lmedge.policies.milp.plugin import (
    NAME,
    JointPlan,
    MilpDeployer,
    MilpParams,
    MilpRouter,
    build_deployer,
    build_router,
)

__all__ = [
    "NAME",
    "JointPlan",
    "MilpDeployer",
    "MilpParams",
    "MilpRouter",
    "Solution",
    "SurrogateWeights",
    "build_deployer",
    "build_router",
    "solve_slot",
]
