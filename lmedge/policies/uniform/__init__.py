"""Uniform spreading: the `static`/`none` planner and the `uniform` router (paper's AL)."""

from lmedge.policies.uniform.planner import StaticPlanner, uniform_macro_policy
from lmedge.policies.uniform.router import UniformRouter

__all__ = ["StaticPlanner", "UniformRouter", "uniform_macro_policy"]
