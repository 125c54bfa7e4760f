"""The plugin catalog: every planner, router and deployer by kebab-case name,
and the named policy profiles (the paper's RR, RF, MA, MAL, PerLLM, ...).

Plugins are registered in one place, `registrations.py` (docs/design.md
"Conventions"). A plugin is built by a factory `(BuildContext) -> plugin`; its
parameters arrive as a mapping which the plugin validates with its own
pydantic model, so a bad parameter is rejected when the configuration is
loaded, loudly.

The registrations are imported on first use (they pull in every policy and
their solvers, which a command that names no policy should not pay for).
Each family of plugins registers into a scratch table and is merged only
when it loaded whole, so a family whose import fails (say, an optional
extra not installed) is left out, logged and named in every "unknown ..."
error, while the rest of the catalog works; the catalog is marked loaded
only after the registrations ran, so nothing is ever stuck half-loaded.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar

from lmedge.api import NO_CAPABILITIES, Capabilities, ClusterContext, Deployer, Planner, Router
from lmedge.errors import ConfigError

log = logging.getLogger(__name__)

P = TypeVar("P", Planner, Router, Deployer)
Kind = Literal["planner", "router", "deployer"]


@dataclass(frozen=True)
class BuildContext:
    """What a plugin factory receives.

    `router` is set for deployers built in the same process as the run's
    router (the controller loop), so a deployer that reads the router's joint
    solve (`Capabilities.joint_router`) gets it from there, not from a
    process-global table.
    """

    context: ClusterContext
    seed: int = 0
    params: Mapping[str, Any] = field(default_factory=dict)
    router: Router | None = None


@dataclass(frozen=True)
class PluginEntry(Generic[P]):
    name: str
    kind: Kind
    factory: Callable[[BuildContext], P]
    summary: str
    #: What the plugin declares (known before it is built: a profile is checked at load).
    capabilities: Capabilities = NO_CAPABILITIES


@dataclass(frozen=True)
class Profile:
    """A named combination of planner + router + deployer."""

    name: str
    planner: str
    router: str
    deployer: str
    summary: str


@dataclass
class Registry:
    """Plugins and profiles by name; what `registrations.py` fills."""

    planners: dict[str, PluginEntry[Planner]] = field(default_factory=dict)
    routers: dict[str, PluginEntry[Router]] = field(default_factory=dict)
    deployers: dict[str, PluginEntry[Deployer]] = field(default_factory=dict)
    profiles: dict[str, Profile] = field(default_factory=dict)

    def add_planner(
        self,
        name: str,
        factory: Callable[[BuildContext], Planner],
        summary: str,
        capabilities: Capabilities = NO_CAPABILITIES,
    ) -> None:
        _add(self.planners, PluginEntry(name, "planner", factory, summary, capabilities))

    def add_router(
        self,
        name: str,
        factory: Callable[[BuildContext], Router],
        summary: str,
        capabilities: Capabilities = NO_CAPABILITIES,
    ) -> None:
        _add(self.routers, PluginEntry(name, "router", factory, summary, capabilities))

    def add_deployer(
        self,
        name: str,
        factory: Callable[[BuildContext], Deployer],
        summary: str,
        capabilities: Capabilities = NO_CAPABILITIES,
    ) -> None:
        _add(self.deployers, PluginEntry(name, "deployer", factory, summary, capabilities))

    def add_profile(self, profile: Profile) -> None:
        if profile.name in self.profiles:
            raise ValueError(f"profile {profile.name!r} registered twice")
        self.profiles[profile.name] = profile

    def merge(self, other: Registry) -> None:
        """Add every entry of `other` (names must be new)."""
        for mine, theirs in (
            (self.planners, other.planners),
            (self.routers, other.routers),
            (self.deployers, other.deployers),
        ):
            for entry in theirs.values():
                _add(mine, entry)
        for p in other.profiles.values():
            self.add_profile(p)


def _add(table: dict[str, PluginEntry[Any]], entry: PluginEntry[Any]) -> None:
    if entry.name in table:
        raise ValueError(f"{entry.kind} {entry.name!r} registered twice")
    table[entry.name] = entry


#: The catalog of this process (filled on first use).
CATALOG = Registry()
PLANNERS = CATALOG.planners
ROUTERS = CATALOG.routers
DEPLOYERS = CATALOG.deployers
PROFILES = CATALOG.profiles
#: Plugin families whose registration failed, with why ({family: error}).
UNAVAILABLE: dict[str, str] = {}


def add_planner(
    name: str,
    factory: Callable[[BuildContext], Planner],
    summary: str,
    capabilities: Capabilities = NO_CAPABILITIES,
) -> None:
    """Register a planner in this process's catalog (e.g. a plugin from outside lmedge)."""
    _ensure_loaded()
    CATALOG.add_planner(name, factory, summary, capabilities)


def add_router(
    name: str,
    factory: Callable[[BuildContext], Router],
    summary: str,
    capabilities: Capabilities = NO_CAPABILITIES,
) -> None:
    """Register a router in this process's catalog."""
    _ensure_loaded()
    CATALOG.add_router(name, factory, summary, capabilities)


def add_deployer(
    name: str,
    factory: Callable[[BuildContext], Deployer],
    summary: str,
    capabilities: Capabilities = NO_CAPABILITIES,
) -> None:
    """Register a deployer in this process's catalog."""
    _ensure_loaded()
    CATALOG.add_deployer(name, factory, summary, capabilities)


def add_profile(profile: Profile) -> None:
    """Register a profile in this process's catalog."""
    _ensure_loaded()
    CATALOG.add_profile(profile)


def _unavailable_note() -> str:
    if not UNAVAILABLE:
        return ""
    return "; not loaded: " + "; ".join(f"{k} ({v})" for k, v in sorted(UNAVAILABLE.items()))


def entry(kind: Kind, name: str) -> PluginEntry[Any]:
    """The registered entry of a `kind` plugin (raises `ConfigError` naming the known ones)."""
    _ensure_loaded()
    table: dict[str, PluginEntry[Any]] = {
        "planner": PLANNERS,
        "router": ROUTERS,
        "deployer": DEPLOYERS,
    }[kind]  # type: ignore[assignment]
    if name not in table:
        known = ", ".join(sorted(table)) or "(none)"
        raise ConfigError(f"unknown {kind} {name!r}; known {kind}s: {known}{_unavailable_note()}")
    return table[name]


def build_planner(name: str, ctx: BuildContext) -> Planner:
    made: Planner = entry("planner", name).factory(ctx)
    return made


def build_router(name: str, ctx: BuildContext) -> Router:
    made: Router = entry("router", name).factory(ctx)
    return made


def build_deployer(name: str, ctx: BuildContext) -> Deployer:
    made: Deployer = entry("deployer", name).factory(ctx)
    return made


def profile(name: str) -> Profile:
    _ensure_loaded()
    if name not in PROFILES:
        known = ", ".join(sorted(PROFILES)) or "(none)"
        raise ConfigError(f"unknown policy {name!r}; known policies: {known}{_unavailable_note()}")
    return PROFILES[name]


_loaded = False
_lock = threading.Lock()


def _ensure_loaded() -> None:
    """Run the registrations once, family by family (see the module docstring)."""
    global _loaded
    if _loaded:
        return
    with _lock:
        if _loaded:
            return
        fill(CATALOG, UNAVAILABLE)
        _loaded = True


def fill(target: Registry, unavailable: dict[str, str]) -> None:
    """Register every family of `registrations.FAMILIES` into `target`.

    A family that raises (on import or while registering) is left out whole
    and recorded in `unavailable` with the error, logged once; a profile whose
    plugins are not all registered is left out with it.
    """
    from lmedge.controller.registrations import FAMILIES, register_profiles

    for family, register in FAMILIES:
        scratch = Registry()
        try:
            register(scratch)
            target.merge(scratch)
        except Exception as exc:  # an optional dependency missing, or a broken plugin
            unavailable[family] = f"{type(exc).__name__}: {exc}"
            log.warning("plugin family %s not loaded: %s: %s", family, type(exc).__name__, exc)
    scratch = Registry()
    register_profiles(scratch)
    for p in scratch.profiles.values():
        missing = [
            f"{kind} {name}"
            for kind, name, table in (
                ("planner", p.planner, target.planners),
                ("router", p.router, target.routers),
                ("deployer", p.deployer, target.deployers),
            )
            if name not in table
        ]
        if missing:
            unavailable[f"profile {p.name}"] = f"needs {', '.join(missing)}"
            continue
        target.add_profile(p)
