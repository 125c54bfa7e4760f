"""Turning a profile name (or three plugin names) into the plugins of one run.

The loop needs one planner, one router and one deployer *per worker node*:
the deployment agents are per node in the paper (a DaemonSet on a cluster),
and a separate instance per node keeps a seeded plugin deterministic even
when the loop runs the deployers concurrently. Each instance gets its own
seed derived from the run seed and its role, so no two share a random stream
and adding a node does not reshuffle the others.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from lmedge.api import (
    ClusterContext,
    Deployer,
    Planner,
    RequestRouter,
    Router,
    capabilities_of,
)
from lmedge.api.runconfig import DEFAULT_PROFILE, PolicyConfig
from lmedge.controller.catalog import (
    BuildContext,
    Profile,
    build_deployer,
    build_planner,
    build_router,
    entry,
    profile,
)
from lmedge.errors import ConfigError


def derive_seed(seed: int, role: str) -> int:
    """A stable 31-bit seed for one plugin instance, from the run seed and its role."""
    return zlib.crc32(f"{seed}:{role}".encode()) & 0x7FFFFFFF


@dataclass(frozen=True)
class PolicyChoice:
    """A profile name, with optional per-tier overrides and plugin parameters.

    Without a profile, the tiers not overridden are `DEFAULT_PROFILE`'s.
    """

    profile: str | None = None
    planner: str | None = None
    router: str | None = None
    deployer: str | None = None
    params: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    @classmethod
    def of(cls, config: PolicyConfig) -> PolicyChoice:
        """The choice a run's stored `PolicyConfig` names (its seed is the caller's)."""
        params: dict[str, Mapping[str, Any]] = {t: dict(p) for t, p in config.params.items()}
        return cls(config.profile, config.planner, config.router, config.deployer, params)

    def config(self, seed: int = 0) -> PolicyConfig:
        """This choice as the `PolicyConfig` a run stores (names checked first)."""
        self.resolve()
        params: dict[Any, dict[str, Any]] = {t: dict(p) for t, p in self.params.items() if p}
        return PolicyConfig(
            profile=self.profile or DEFAULT_PROFILE,
            planner=self.planner,
            router=self.router,
            deployer=self.deployer,
            params=params,
            seed=seed,
        )

    def resolve(self) -> Profile:
        """The effective planner/router/deployer names (raises `ConfigError` if unknown)."""
        base = profile(self.profile or DEFAULT_PROFILE)
        name = self.profile or "custom"
        planner = self.planner or base.planner
        router = self.router or base.router
        deployer = self.deployer or base.deployer
        if (planner, router, deployer) != (base.planner, base.router, base.deployer):
            name = f"{name}[{planner}/{router}/{deployer}]"
        chosen = {"planner": planner, "router": router, "deployer": deployer}
        # each tier's plugin parameters: the profile's, for its own plugin only,
        # under the choice's (a run's --<tier>-param wins)
        params = {
            t: merged
            for t, plugin in chosen.items()
            if (
                merged := {
                    **(base.params.get(t, {}) if plugin == getattr(base, t) else {}),
                    **self.params.get(t, {}),
                }
            )
        }
        return Profile(name, planner, router, deployer, base.summary, params)


@dataclass
class PolicyPlugins:
    """The plugin instances of one run, and the choice and seed they were built from
    (a gateway routing request by request builds its own router from them)."""

    name: str
    planner: Planner
    router: Router
    deployers: dict[str, Deployer]
    choice: PolicyChoice | None = None
    seed: int = 0


def build_plugins(
    choice: PolicyChoice, ctx: ClusterContext, seed: int, *, deployers_in_process: bool = True
) -> PolicyPlugins:
    """Build every plugin of `choice` for `ctx`; bad names or parameters raise `ConfigError`.

    With `deployers_in_process=False` (a cluster: the node agents run the
    deployers) no deployer is built here, and a profile whose deployer needs
    its router in the same process is refused (`check_split`).
    """
    p = choice.resolve()

    def bc(kind: str, role: str, router: Router | None = None) -> BuildContext:
        return BuildContext(ctx, derive_seed(seed, role), p.params.get(kind, {}), router)

    if not deployers_in_process:
        check_split(p)
    planner = build_planner(p.planner, bc("planner", "planner"))
    router = build_router(p.router, bc("router", "router"))
    deployers = (
        {
            n.name: build_deployer(p.deployer, bc("deployer", f"deployer:{n.name}", router))
            for n in ctx.workers
        }
        if deployers_in_process
        else {}
    )
    return PolicyPlugins(p.name, planner, router, deployers, choice, seed)


def check_split(p: Profile) -> None:
    """Refuse a profile whose deployer cannot run apart from its router (in a node agent).

    A deployer declaring `Capabilities.joint_router` reads the placements its
    router solved in the same process; a node agent has no router, so on a
    cluster the profile would run with deployers that never decide.
    """
    joint = entry("deployer", p.deployer).capabilities.joint_router
    if joint is not None:
        raise ConfigError(
            f"policy {p.name}: the {p.deployer} deployer places what the {joint} router solves "
            "jointly in the same process, but on a cluster the deployers run in the node "
            "agents, apart from the router; use this policy with `lmedge simulate`, or a "
            "policy whose deployer decides alone on a cluster (e.g. ma)"
        )


def build_node_deployer(
    choice: PolicyChoice, ctx: ClusterContext, node: str, seed: int
) -> Deployer:
    """The deployer a node agent runs for `node` (the same seed the loop would give it).

    Refuses (`ConfigError`) a profile whose deployer needs its router in the
    same process (`check_split`).
    """
    p = choice.resolve()
    check_split(p)
    return build_deployer(
        p.deployer,
        BuildContext(ctx, derive_seed(seed, f"deployer:{node}"), p.params.get("deployer", {})),
    )


#: The router a gateway falls back on when the run's router is late or fails on
#: a window and declares no `Capabilities.fallback_router` of its own: CEMA's
#: load-aware seed (longest request first, each to the earliest finish; one pass
#: over the catalogue).
SEED_ROUTER = "cema-seed"


def build_gateway_router(config: PolicyConfig, ctx: ClusterContext, node: str) -> RequestRouter:
    """The request-level router `node`'s gateway runs on its own requests.

    The run's router, built from the same catalog entry and parameters as the
    controller's, with a seed of its own per node (`router:NODE`), so each
    gateway's copy draws its own stream. `ConfigError` when the router does
    not route requests.
    """
    choice = PolicyChoice.of(config)
    p = choice.resolve()
    name = p.router
    router = build_router(
        name,
        BuildContext(ctx, derive_seed(config.seed, f"router:{node}"), p.params.get("router", {})),
    )
    if not (capabilities_of(router).routes_requests and isinstance(router, RequestRouter)):
        raise ConfigError(f"router {name} does not route requests one by one")
    return router


def build_seed_router(config: PolicyConfig, ctx: ClusterContext, node: str) -> RequestRouter:
    """The fallback `node`'s gateway routes a window with when the run's router fails on it.

    The run's router's `Capabilities.fallback_router` (LYREO's: `ll-kv`), else
    `SEED_ROUTER`; default parameters, a seed of its own per node (`seed:NODE`).
    """
    declared = entry("router", PolicyChoice.of(config).resolve().router).capabilities
    name = declared.fallback_router or SEED_ROUTER
    router = build_router(name, BuildContext(ctx, derive_seed(config.seed, f"seed:{node}")))
    if not (capabilities_of(router).routes_requests and isinstance(router, RequestRouter)):
        raise ConfigError(f"router {name} does not route requests one by one")
    return router
