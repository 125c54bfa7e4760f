"""Registers every plugin and profile with the catalog. One line per plugin.

Plugins are grouped in families (`FAMILIES`), each a function that imports
its modules and registers into the `Registry` it is given: the catalog merges
a family only when all of it loaded, so one broken or missing import (an
optional extra) costs that family, not the catalog. This module imports the
catalog's types only and the catalog never imports it: a process's composition
root registers these (`lmedge.processes.plugins.register_plugins`).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TypeVar

from lmedge.api import Capabilities, Router
from lmedge.controller.catalog import BuildContext, Profile, Registry
from lmedge.policies.kit.support import no_params

_T = TypeVar("_T")
#: What LYREO's request routers fall back on at a gateway: least KV memory-time,
#: the signal they route on (CEMA's seed would send work to a full KV pool).
KV_FALLBACK = "ll-kv"


def _plain(
    kind: str, name: str, make: Callable[[BuildContext], _T]
) -> Callable[[BuildContext], _T]:
    """A factory for a plugin without parameters: rejects any it is given."""

    def factory(ctx: BuildContext) -> _T:
        no_params(kind, name, ctx.params)
        return make(ctx)

    return factory


def baselines(reg: Registry) -> None:
    """Deterministic baselines (lmedge.policies)."""
    from lmedge.policies import full, local, uniform
    from lmedge.policies import random as rnd

    reg.add_planner(
        "random",
        _plain("planner", "random", lambda b: rnd.RandomPlanner(b.seed)),
        "uniformly random macro policy over feasible nodes (the random baseline)",
    )
    reg.add_planner(
        "static",
        _plain("planner", "static", lambda b: uniform.StaticPlanner("static")),
        "no planning: uniform weights, every hostable LM in each role set",
    )
    reg.add_planner(
        "none",
        _plain("planner", "none", lambda b: uniform.StaticPlanner("none")),
        "alias of static",
    )
    reg.add_router(
        "random",
        _plain("router", "random", lambda b: rnd.RandomRouter(b.seed)),
        "uniformly random feasible destination per (origin, LM)",
    )
    reg.add_router(
        "random-request",
        lambda b: rnd.build_request(b.seed, b.params),
        "uniformly random server per request (LYREO's Random baseline)",
        Capabilities(routes_requests=True),
    )
    reg.add_router(
        "uniform",
        _plain("router", "uniform", lambda b: uniform.UniformRouter()),
        "smooth weighted round-robin over feasible nodes by macro weights (paper AL)",
    )
    reg.add_router(
        "local",
        _plain("router", "local", lambda b: local.LocalRouter()),
        "origin if it can host the LM, else the nearest feasible node",
    )
    reg.add_deployer(
        "random",
        _plain("deployer", "random", lambda b: rnd.RandomDeployer(b.seed)),
        "random activation within the node's budgets, redrawn every slot",
    )
    reg.add_deployer(
        "full",
        _plain("deployer", "full", lambda b: full.FullDeployer()),
        "activate as many LMs as CPU/GPU allow, never reconfigure",
    )


def lyapunov(reg: Registry) -> None:
    """Drift-plus-penalty deployment (paper)."""
    from lmedge.policies.lyapunov import build as build_lyapunov

    reg.add_deployer(
        "lyapunov",
        lambda b: build_lyapunov(b.context, b.seed, b.params),
        "drift-plus-penalty activation: backlog x service rate - GPU price - churn (paper)",
    )


def perllm(reg: Registry) -> None:
    """PerLLM's bandit router."""
    from lmedge.policies.perllm import build as build_perllm

    reg.add_router(
        "perllm-ucb",
        lambda b: build_perllm(b.context, b.seed, b.params),
        "PerLLM: UCB1 bandit per (origin, LM), reward 1 - min(d/tau, 1), delayed feedback",
    )


def milp(reg: Registry) -> None:
    """The joint MILP router + deployer (HiGHS)."""
    from lmedge.policies.milp import build_deployer as build_milp_deployer
    from lmedge.policies.milp import build_router as build_milp_router

    reg.add_router(
        "milp",
        lambda b: build_milp_router(b.context, b.seed, b.params),
        "joint MILP routing + activation per slot (HiGHS, linear surrogate of Eq. 10)",
    )
    reg.add_deployer(
        "milp",
        lambda b: build_milp_deployer(b.context, b.seed, b.params, b.router),
        "the activation the milp router solved for this slot (pair with router milp)",
        Capabilities(joint_router="milp"),
    )


def cema(reg: Registry) -> None:
    """CEMA-Router (memetic batch routing over request classes)."""
    from lmedge.policies.cema import build as build_cema

    reg.add_router(
        "cema",
        lambda b: build_cema(b.context, b.seed, b.params),
        "CEMA-Router: memetic batch routing over quality, cost, energy, completion time",
        Capabilities(routes_request_classes=True),
    )
    from lmedge.policies.cema.uniroute import build as build_uniroute

    reg.add_router(
        "uniroute",
        lambda b: build_uniroute(b.context, b.seed, b.params),
        "UniRoute (CEMA's baseline): per-cluster error + 0.05 x normalized cost, quality store",
        Capabilities(routes_request_classes=True),
    )
    # request mode: one gene per request, in 1-s windows; and the paper's baselines
    # over the same catalogue and evaluator (lmedge/policies/cema/requests.py)
    for name, method, summary in CEMA_REQUEST_ROUTERS:
        reg.add_router(
            name,
            partial(_cema_request, build_cema, method),
            summary,
            Capabilities(routes_request_classes=True, routes_requests=True),
        )


def _cema_request(build: Callable[..., Router], method: str, b: BuildContext) -> Router:
    """A request-mode CEMA router running `method` (the profile's name decides it)."""
    return build(b.context, b.seed, {**b.params, "mode": "request", "method": method})


def _request_router(name: str, b: BuildContext) -> Router:
    from lmedge.policies.lyreo import build_request_router

    return build_request_router(name, b.params)


#: (router and profile name, request-mode method, summary): CEMA per request and its baselines.
CEMA_REQUEST_ROUTERS: tuple[tuple[str, str, str], ...] = (
    ("cema-request", "cema", "CEMA-Router per request: memetic search over each 1-s window"),
    ("cema-seed", "seed", "CEMA's load-aware seed per window (no search)"),
    ("cema-independent", "independent", "each request to its own best J (no joint term)"),
    ("cema-rr", "round-robin", "Round Robin over the (node, model) catalogue"),
    ("cema-ll", "least-loaded", "Least-Loaded: least outstanding work (CEMA's monitor)"),
    ("cema-cloud", "cloud-only", "Cloud-Only: least outstanding work among cloud nodes"),
    ("cema-edge", "edge-only", "Edge-Only: least outstanding work among edge nodes"),
)


def lyreo(reg: Registry) -> None:
    """LYREO: the learned routers and the Lyapunov greedy, per request; the batch greedy."""
    from lmedge.policies.lyreo import build as build_lyreo
    from lmedge.policies.lyreo.learned import build_learned

    reg.add_router(
        "lyreo",
        lambda b: build_learned(b.params, "lyreo"),
        "LYREO: PPO actor trained on LSTM-redistributed rewards, a server per request",
        Capabilities(routes_requests=True, fallback_router=KV_FALLBACK),
    )
    reg.add_router(
        "ly-ppo",
        lambda b: build_learned(b.params, "ly-ppo"),
        "Ly-PPO: LYREO's PPO without reward redistribution (ablation), per request",
        Capabilities(routes_requests=True, fallback_router=KV_FALLBACK),
    )
    reg.add_router(
        "ppo-fixed",
        lambda b: build_learned(b.params, "ppo-fixed"),
        "PPO with a fixed balancing penalty, no virtual queue (ablation), per request",
        Capabilities(routes_requests=True, fallback_router=KV_FALLBACK),
    )
    reg.add_router(
        "lyreo-greedy",
        lambda b: build_lyreo(b.context, b.seed, b.params),
        "LYREO's Lyapunov greedy per (origin, LM) batch, for per-prompt LMs (no learning)",
    )
    for name, summary in (
        ("lyreo-ly", "LYREO's Lyapunov greedy per request on token-level KV memory-time"),
        ("lyreo-nolb", "LYREO-NoLB: lyreo-ly without the balance term (latency only)"),
        ("lyreo-count", "LYREO-Count: lyreo-ly with active requests as the workload"),
    ):
        reg.add_router(
            name,
            partial(_request_router, name),
            summary,
            Capabilities(routes_requests=True, fallback_router=KV_FALLBACK),
        )


def per_request(reg: Registry) -> None:
    """LYREO's per-request baselines: Least-Loaded (global) and Static batching."""
    from lmedge.policies import leastloaded, staticbatch

    reg.add_router(
        "ll-kv",
        lambda b: leastloaded.build("ll-kv", b.params),
        "Least-Loaded: each request to the server with the least KV memory-time now",
        Capabilities(routes_requests=True),
    )
    reg.add_router(
        "ll-count",
        lambda b: leastloaded.build("ll-count", b.params),
        "Least-Loaded: each request to the server with the fewest active requests",
        Capabilities(routes_requests=True, fallback_router=KV_FALLBACK),
    )
    reg.add_router(
        "static-batch",
        lambda b: staticbatch.build(b.params),
        "Static: each request where a static batch of the slot would finish it first",
        Capabilities(routes_requests=True, fallback_router=KV_FALLBACK),
    )


def agentic(reg: Registry) -> None:
    """The paper's three agents (lmedge.agents)."""
    from lmedge import agents

    reg.add_planner(
        "agentic",
        lambda b: agents.AgenticPlanner.build(b.context, b.params, b.seed),
        "Global Planning Agent: LLM when an endpoint is set, else capacity water-filling",
    )
    reg.add_router(
        "agentic",
        lambda b: agents.AgenticRouter.build(b.context, b.params),
        "Prompt Scheduling Agent: LLM when an endpoint is set, else earliest estimated completion",
    )
    reg.add_deployer(
        "agentic",
        lambda b: agents.AgenticDeployer.build(b.context, b.params),
        "LM Deployment Agent per node: LLM when an endpoint is set, else role-first by backlog",
    )


#: (family, register) in registration order.
FAMILIES: tuple[tuple[str, Callable[[Registry], None]], ...] = (
    ("baselines", baselines),
    ("lyapunov", lyapunov),
    ("perllm", perllm),
    ("milp", milp),
    ("cema", cema),
    ("lyreo", lyreo),
    ("per-request", per_request),
    ("agentic", agentic),
)


#: LYREO's setting (examples/lyreo): every server runs its model throughout (`full`),
#: the router is what differs. (profile, router, summary)
LYREO_PROFILES: tuple[tuple[str, str, str], ...] = (
    ("lyreo", "lyreo", "LYREO: the trained PPO actor with reward redistribution, per request"),
    ("ly-ppo", "ly-ppo", "Ly-PPO: no reward redistribution"),
    ("ppo-fixed", "ppo-fixed", "PPO, fixed balancing penalty (no virtual queue)"),
    ("lyreo-ly", "lyreo-ly", "LYREO's Lyapunov scheduler per request (no PPO)"),
    ("lyreo-nolb", "lyreo-nolb", "LYREO-NoLB ablation: no load-balance term"),
    ("lyreo-count", "lyreo-count", "LYREO-Count ablation: request count as workload"),
    ("static-batch", "static-batch", "Static batching baseline (LYREO §V-B)"),
    ("ll-kv", "ll-kv", "Least-Loaded by KV memory-time (global, per request)"),
    ("ll-count", "ll-count", "Least-Loaded by active requests (global, per request)"),
    ("random-request", "random-request", "Random server per request"),
)


def register_profiles(reg: Registry) -> None:
    """The named profiles (a profile is registered only when its three plugins are)."""
    for p in (
        Profile(
            "ma",
            "agentic",
            "agentic",
            "agentic",
            "MA: the three agents (paper)",
            # the planner follows the newest traffic (rules/planner.py); mal keeps it
            # off: measured on 50 generated scenarios, it suits the rule deployer only
            params={"planner": {"follow_traffic": True}},
        ),
        Profile("rr", "static", "random", "random", "RR: random routing + random deployment"),
        Profile("rf", "static", "random", "full", "RF: random routing + full activation"),
        Profile("ll", "static", "local", "lyapunov", "LL: local routing + Lyapunov deployment"),
        Profile("rl", "static", "random", "lyapunov", "RL: random routing + Lyapunov deployment"),
        Profile(
            "al",
            "static",
            "uniform",
            "lyapunov",
            "AL: uniform routing over feasible nodes + Lyapunov",
        ),
        Profile(
            "perllm",
            "static",
            "perllm-ucb",
            "lyapunov",
            "PerLLM: UCB routing bandit + Lyapunov deployment",
        ),
        Profile(
            "mal",
            "agentic",
            "agentic",
            "lyapunov",
            "MAL: agentic planner and router + Lyapunov deployment",
        ),
        Profile("milp", "static", "milp", "milp", "MILP: joint routing and activation per slot"),
        Profile(
            "cema", "static", "cema", "lyapunov", "CEMA-Router batch routing + Lyapunov deployment"
        ),
        Profile(
            "uniroute",
            "static",
            "uniroute",
            "lyapunov",
            "UniRoute quality-cost routing (CEMA's baseline) + Lyapunov deployment",
        ),
        *(
            Profile(name, "static", router, "full", summary)
            for name, router, summary in LYREO_PROFILES
        ),
        Profile(
            "lyreo-greedy",
            "static",
            "lyreo-greedy",
            "lyapunov",
            "LYREO's Lyapunov greedy per (origin, LM) batch (no learning) + Lyapunov deployment",
        ),
        *(
            Profile(name, "static", name, "lyapunov", f"{summary} + Lyapunov deployment")
            for name, _, summary in CEMA_REQUEST_ROUTERS
        ),
    ):
        reg.add_profile(p)
