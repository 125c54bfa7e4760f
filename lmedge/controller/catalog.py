"""The plugin catalog: every planner, router and deployer by kebab-case name,
and the named policy profiles (the paper's RR, RF, MA, MAL, PerLLM, ...).

Plugins are listed in one place, `registrations.py` (docs/design.md
"Conventions"). A plugin is built by a factory `(BuildContext) -> plugin`; its
parameters arrive as a mapping which the plugin validates with its own
pydantic model, so a bad parameter is rejected when the configuration is
loaded, loudly.

The catalog does not fill itself: a process's composition root calls
`register` (through `lmedge.processes.plugins.register_plugins`) before it
builds a plugin, and a lookup before that raises `CatalogNotFilled` instead of
quietly importing every policy. Registering is explicit, so a command that
names no policy never pays for the policies' imports and solvers. Each family
of plugins registers into a scratch table and is merged only when it loaded
whole, so a family whose import fails (say, an optional extra not installed)
is left out, logged and named in every "unknown ..." error, while the rest of
the catalog works; the catalog is marked filled only after the registrations
ran, so nothing is ever stuck half-filled.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar

from lmedge.api import NO_CAPABILITIES, Capabilities, ClusterContext, Deployer, Planner, Router
from lmedge.errors import ConfigError

log = logging.getLogger(__name__)

P = TypeVar("P", Planner, Router, Deployer)
Kind = Literal["planner", "router", "deployer"]
#: A family's registration: imports its modules and registers into the `Registry` given.
Family = Callable[["Registry"], None]


class CatalogNotFilled(RuntimeError):
    """A plugin or profile was looked up before this process registered any.

    A programming error, not a user's: the process's composition root
    (`lmedge.processes`) must call `register_plugins()` before it builds a
    policy.
    """


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
    """A named combination of planner + router + deployer, with the parameters the
    profile gives its own plugins (tier -> name -> value; a run's `--<tier>-param`
    wins, and a tier overridden with another plugin does not get them)."""

    name: str
    planner: str
    router: str
    deployer: str
    summary: str
    params: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)


@dataclass
class Registry:
    """Plugins and profiles by name; what the families of `registrations.py` fill."""

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


#: The catalog of this process (filled by `register`, called by the process's root).
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
    CATALOG.add_planner(name, factory, summary, capabilities)


def add_router(
    name: str,
    factory: Callable[[BuildContext], Router],
    summary: str,
    capabilities: Capabilities = NO_CAPABILITIES,
) -> None:
    """Register a router in this process's catalog."""
    CATALOG.add_router(name, factory, summary, capabilities)


def add_deployer(
    name: str,
    factory: Callable[[BuildContext], Deployer],
    summary: str,
    capabilities: Capabilities = NO_CAPABILITIES,
) -> None:
    """Register a deployer in this process's catalog."""
    CATALOG.add_deployer(name, factory, summary, capabilities)


def add_profile(profile: Profile) -> None:
    """Register a profile in this process's catalog."""
    CATALOG.add_profile(profile)


def _unavailable_note() -> str:
    if not UNAVAILABLE:
        return ""
    return "; not loaded: " + "; ".join(f"{k} ({v})" for k, v in sorted(UNAVAILABLE.items()))


def entry(kind: Kind, name: str) -> PluginEntry[Any]:
    """The registered entry of a `kind` plugin (raises `ConfigError` naming the known ones)."""
    _require_filled()
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
    """The registered profile `name` (raises `ConfigError` naming the known ones)."""
    _require_filled()
    if name not in PROFILES:
        known = ", ".join(sorted(PROFILES)) or "(none)"
        raise ConfigError(f"unknown policy {name!r}; known policies: {known}{_unavailable_note()}")
    return PROFILES[name]


_filled = False
_lock = threading.Lock()


def filled() -> bool:
    """Whether this process's catalog was filled (`register` ran)."""
    return _filled


def _require_filled() -> None:
    if not _filled:
        raise CatalogNotFilled(
            "the plugin catalog is empty: this process's composition root must call "
            "lmedge.processes.plugins.register_plugins() before it builds a policy"
        )


def register(families: Sequence[tuple[str, Family]], profiles: Family) -> None:
    """Fill this process's catalog with `families`, then `profiles`, once.

    Idempotent and thread-safe: the first call fills the catalog (see
    `fill`), later calls return at once whatever they are given.
    """
    global _filled
    if _filled:
        return
    with _lock:
        if _filled:
            return
        fill(CATALOG, UNAVAILABLE, families, profiles)
        _filled = True


def fill(
    target: Registry,
    unavailable: dict[str, str],
    families: Sequence[tuple[str, Family]],
    profiles: Family,
) -> None:
    """Register every `(name, family)` of `families` into `target`, then the `profiles`.

    A family that raises (on import or while registering) is left out whole
    and recorded in `unavailable` with the error, logged once; a profile whose
    plugins are not all registered is left out with it.
    """
    for family, register_family in families:
        scratch = Registry()
        try:
            register_family(scratch)
            target.merge(scratch)
        except Exception as exc:  # an optional dependency missing, or a broken plugin
            unavailable[family] = f"{type(exc).__name__}: {exc}"
            log.warning("plugin family %s not loaded: %s: %s", family, type(exc).__name__, exc)
    scratch = Registry()
    profiles(scratch)
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
