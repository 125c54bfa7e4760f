"""The plugin catalog: every planner, router and deployer by kebab-case name,
and the named policy profiles (the paper's RR, RF, MA, MAL, PerLLM, ...).

This is the one place where plugins are registered (docs/design.md "Conventions"). A plugin is
built by a factory `(BuildContext) -> plugin`; its parameters arrive as a
mapping which the plugin validates with its own pydantic model, so a bad
parameter is rejected when the configuration is loaded, loudly.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar

from lmedge.api import ClusterContext, Deployer, Planner, Router
from lmedge.errors import ConfigError

P = TypeVar("P", Planner, Router, Deployer)
Kind = Literal["planner", "router", "deployer"]


@dataclass(frozen=True)
class BuildContext:
    """What a plugin factory receives."""

    context: ClusterContext
    seed: int = 0
    params: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class PluginEntry(Generic[P]):
    name: str
    kind: Kind
    factory: Callable[[BuildContext], P]
    summary: str


@dataclass(frozen=True)
class Profile:
    """A named combination of planner + router + deployer."""

    name: str
    planner: str
    router: str
    deployer: str
    summary: str


PLANNERS: dict[str, PluginEntry[Planner]] = {}
ROUTERS: dict[str, PluginEntry[Router]] = {}
DEPLOYERS: dict[str, PluginEntry[Deployer]] = {}
PROFILES: dict[str, Profile] = {}


def _add(table: dict[str, PluginEntry[Any]], entry: PluginEntry[Any]) -> None:
    if entry.name in table:
        raise ValueError(f"{entry.kind} {entry.name!r} registered twice")
    table[entry.name] = entry


def add_planner(name: str, factory: Callable[[BuildContext], Planner], summary: str) -> None:
    _add(PLANNERS, PluginEntry(name, "planner", factory, summary))


def add_router(name: str, factory: Callable[[BuildContext], Router], summary: str) -> None:
    _add(ROUTERS, PluginEntry(name, "router", factory, summary))


def add_deployer(name: str, factory: Callable[[BuildContext], Deployer], summary: str) -> None:
    _add(DEPLOYERS, PluginEntry(name, "deployer", factory, summary))


def add_profile(profile: Profile) -> None:
    if profile.name in PROFILES:
        raise ValueError(f"profile {profile.name!r} registered twice")
    PROFILES[profile.name] = profile


def _lookup(table: dict[str, PluginEntry[Any]], kind: str, name: str) -> PluginEntry[Any]:
    _ensure_loaded()
    if name not in table:
        known = ", ".join(sorted(table)) or "(none)"
        raise ConfigError(f"unknown {kind} {name!r}; known {kind}s: {known}")
    return table[name]


def build_planner(name: str, ctx: BuildContext) -> Planner:
    entry: PluginEntry[Planner] = _lookup(PLANNERS, "planner", name)
    return entry.factory(ctx)


def build_router(name: str, ctx: BuildContext) -> Router:
    entry: PluginEntry[Router] = _lookup(ROUTERS, "router", name)
    return entry.factory(ctx)


def build_deployer(name: str, ctx: BuildContext) -> Deployer:
    entry: PluginEntry[Deployer] = _lookup(DEPLOYERS, "deployer", name)
    return entry.factory(ctx)


def profile(name: str) -> Profile:
    _ensure_loaded()
    if name not in PROFILES:
        known = ", ".join(sorted(PROFILES)) or "(none)"
        raise ConfigError(f"unknown policy {name!r}; known policies: {known}")
    return PROFILES[name]


_loaded = False


def _ensure_loaded() -> None:
    """Import the registration module once (kept separate so this file stays tiny)."""
    global _loaded
    if not _loaded:
        _loaded = True
        from lmedge.controller import registrations  # noqa: F401
