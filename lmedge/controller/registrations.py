"""Registers every plugin and profile with the catalog. One line per plugin."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from lmedge import agents
from lmedge.controller.catalog import (
    BuildContext,
    Profile,
    add_deployer,
    add_planner,
    add_profile,
    add_router,
)
from lmedge.policies import full, local, uniform
from lmedge.policies import random as rnd
from lmedge.policies._support import no_params
from lmedge.policies.cema import build as build_cema
from lmedge.policies.lyapunov import build as build_lyapunov
from lmedge.policies.lyreo import build as build_lyreo
from lmedge.policies.milp import build_deployer as build_milp_deployer
from lmedge.policies.milp import build_router as build_milp_router
from lmedge.policies.perllm import build as build_perllm

_T = TypeVar("_T")


def _plain(
    kind: str, name: str, make: Callable[[BuildContext], _T]
) -> Callable[[BuildContext], _T]:
    """A factory for a plugin without parameters: rejects any it is given."""

    def factory(ctx: BuildContext) -> _T:
        no_params(kind, name, ctx.params)
        return make(ctx)

    return factory


__all__ = ["Profile", "add_deployer", "add_planner", "add_profile", "add_router"]

# --- deterministic baselines (lmedge.policies) --------------------------------
add_planner(
    "random",
    _plain("planner", "random", lambda b: rnd.RandomPlanner(b.seed)),
    "uniformly random macro policy over feasible nodes (the random baseline)",
)
add_planner(
    "static",
    _plain("planner", "static", lambda b: uniform.StaticPlanner("static")),
    "no planning: uniform weights, every hostable LM in each role set",
)
add_planner(
    "none", _plain("planner", "none", lambda b: uniform.StaticPlanner("none")), "alias of static"
)
add_router(
    "random",
    _plain("router", "random", lambda b: rnd.RandomRouter(b.seed)),
    "uniformly random feasible destination per (origin, LM)",
)
add_router(
    "uniform",
    _plain("router", "uniform", lambda b: uniform.UniformRouter()),
    "smooth weighted round-robin over feasible nodes by macro weights (paper AL)",
)
add_router(
    "local",
    _plain("router", "local", lambda b: local.LocalRouter()),
    "origin if it can host the LM, else the nearest feasible node",
)
add_deployer(
    "random",
    _plain("deployer", "random", lambda b: rnd.RandomDeployer(b.seed)),
    "random activation within the node's budgets, redrawn every slot",
)
add_deployer(
    "full",
    _plain("deployer", "full", lambda b: full.FullDeployer()),
    "activate as many LMs as CPU/GPU allow, never reconfigure",
)

# --- model-based baselines and seed systems (lmedge.policies) ----------------
add_deployer(
    "lyapunov",
    lambda b: build_lyapunov(b.context, b.seed, b.params),
    "drift-plus-penalty activation: backlog x service rate - GPU price - churn (paper)",
)
add_router(
    "perllm-ucb",
    lambda b: build_perllm(b.context, b.seed, b.params),
    "PerLLM: UCB1 bandit per (origin, LM), reward 1 - min(d/tau, 1), delayed feedback",
)
add_router(
    "milp",
    lambda b: build_milp_router(b.context, b.seed, b.params),
    "joint MILP routing + activation per slot (HiGHS, linear surrogate of Eq. 10)",
)
add_deployer(
    "milp",
    lambda b: build_milp_deployer(b.context, b.seed, b.params),
    "the activation the milp router solved for this slot (pair with router milp)",
)
add_router(
    "cema",
    lambda b: build_cema(b.context, b.seed, b.params),
    "CEMA-Router: memetic batch routing over quality, cost, energy, completion time",
)
add_router(
    "lyreo",
    lambda b: build_lyreo(b.context, b.seed, b.params),
    "LYREO: drift-plus-penalty routing, latency vs KV memory-time load balance",
)

# --- agents (lmedge.agents) ---------------------------------------------------
add_planner(
    "agentic",
    lambda b: agents.AgenticPlanner.build(b.context, b.params, b.seed),
    "Global Planning Agent: LLM when an endpoint is set, else capacity water-filling",
)
add_router(
    "agentic",
    lambda b: agents.AgenticRouter.build(b.context, b.params),
    "Prompt Scheduling Agent: LLM when an endpoint is set, else earliest estimated completion",
)
add_deployer(
    "agentic",
    lambda b: agents.AgenticDeployer.build(b.context, b.params),
    "LM Deployment Agent per node: LLM when an endpoint is set, else role-first by backlog",
)

# --- profiles -----------------------------------------------------------------
add_profile(Profile("ma", "agentic", "agentic", "agentic", "MA: the three agents (paper)"))
add_profile(Profile("rr", "static", "random", "random", "RR: random routing + random deployment"))
add_profile(Profile("rf", "static", "random", "full", "RF: random routing + full activation"))
add_profile(
    Profile(
        "ll",
        "static",
        "local",
        "lyapunov",
        "LL: local routing + Lyapunov deployment",
    )
)

# profiles: model-based baselines
add_profile(
    Profile("rl", "static", "random", "lyapunov", "RL: random routing + Lyapunov deployment")
)
add_profile(
    Profile(
        "al", "static", "uniform", "lyapunov", "AL: uniform routing over feasible nodes + Lyapunov"
    )
)
add_profile(
    Profile(
        "perllm",
        "static",
        "perllm-ucb",
        "lyapunov",
        "PerLLM: UCB routing bandit + Lyapunov deployment",
    )
)
add_profile(
    Profile(
        "mal",
        "agentic",
        "agentic",
        "lyapunov",
        "MAL: agentic planner and router + Lyapunov deployment",
    )
)
add_profile(
    Profile("milp", "static", "milp", "milp", "MILP: joint routing and activation per slot")
)
add_profile(
    Profile("cema", "static", "cema", "lyapunov", "CEMA-Router batch routing + Lyapunov deployment")
)
add_profile(
    Profile(
        "lyreo", "static", "lyreo", "lyapunov", "LYREO load-balanced routing + Lyapunov deployment"
    )
)
# end model-based profiles
