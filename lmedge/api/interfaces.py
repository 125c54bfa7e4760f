"""The plugin and backend protocols every policy and world implements.

A *policy* is a Planner + Router + Deployer. Policies are pure: they take an
observation and return a `Decision`; no I/O and no wall clock, so the same
objects run in the emulator and on the cluster. Learning policies (PerLLM's
bandits) receive completed requests through `observe`. A plugin declares
what the loop must know about it in `capabilities` (`Capabilities`).

A `ClusterBackend` is one world (emulated or Kubernetes). The controller loop
drives it through this protocol only, so it cannot tell the two apart; the
backend's `clock` is the injected time source (SimPy virtual time or the wall
clock).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from pydantic import Field

from lmedge.api.base import WireModel
from lmedge.api.decisions import Decision, MacroPolicy, Placement, Route, RoutingMap
from lmedge.api.live import ContextUpdate
from lmedge.api.observations import (
    Arrival,
    ClusterContext,
    NodeObservation,
    PlanningObservation,
    RequestWindow,
    SlotObservation,
    Snapshot,
)
from lmedge.api.records import NodeTelemetry, RequestRecord


@dataclass(frozen=True)
class Capabilities:
    """What a plugin declares about itself, so no caller has to probe for attributes.

    - `routes_request_classes` (router): it routes request classes itself
      (e.g. `cema` chooses the model); otherwise the loop shows it each class
      as its first model and maps the result back (`lmedge.policies.classes`).
    - `routes_requests` (router): besides its slot map, it routes each request
      itself in windows of `window_s` seconds of at most `window_requests`
      requests (`RequestRouter.route_requests`, e.g. `cema`'s request mode);
      where the backend cannot call it per window the slot map applies, and
      a window whose call fails or answers wrongly keeps the slot map too.
    - `fallback_router` (request-level router): the cheap request router a
      gateway routes a window with when this one is late or fails on it
      (None: CEMA's load-aware seed, `cema-seed`); LYREO's routers name
      `ll-kv`, which reads the KV usage they route on.
    - `io_bound` (deployer): a call waits on I/O (an LLM over HTTP), so the
      loop runs the nodes' deployers concurrently.
    - `joint_router` (deployer): the name of the router whose joint solve in
      the same process this deployer reads its placements from (`milp`).
      Such a deployer cannot run in a node agent, apart from its router: a
      profile pairing them is refused when it is loaded for a cluster.
    - `reads_baseline` (planner): it reads `PlanningObservation.baseline` (an
      LLM's prompt does), so a run on the emulator measures the random
      baseline first (an epoch of loop slots); for any other planner it would
      be work whose result nobody reads, and is skipped.
    - `reads_traffic` (planner): it plans from `PlanningObservation.traffic`,
      so a plan made with none (the run's first) is a guess: the loop re-plans
      once `FIRST_TRAFFIC_SLOTS` slots of traffic have been seen, instead of
      running the guess for the whole first epoch, and its observations'
      `traffic` adds this epoch's so far to the last epoch's.
    """

    routes_request_classes: bool = False
    routes_requests: bool = False
    window_s: float = 1.0
    window_requests: int = 128
    fallback_router: str | None = None
    io_bound: bool = False
    joint_router: str | None = None
    reads_baseline: bool = False
    reads_traffic: bool = False


#: What a plugin that declares nothing can do: the defaults above.
NO_CAPABILITIES = Capabilities()


@runtime_checkable
class DeclaresCapabilities(Protocol):
    """A plugin with a `capabilities` declaration; plugins without one have `NO_CAPABILITIES`."""

    capabilities: Capabilities


def capabilities_of(plugin: object) -> Capabilities:
    """The plugin's declared `Capabilities` (`NO_CAPABILITIES` when it declares none)."""
    if isinstance(plugin, DeclaresCapabilities) and isinstance(plugin.capabilities, Capabilities):
        return plugin.capabilities
    return NO_CAPABILITIES


@runtime_checkable
class Planner(Protocol):
    """Tier 1: once per epoch, a macro policy."""

    name: str

    def plan(self, obs: PlanningObservation) -> Decision[MacroPolicy]: ...


@runtime_checkable
class Router(Protocol):
    """Tier 2: every slot, a routing map for the (origin, LM) pairs with arrivals."""

    name: str

    def route(self, obs: SlotObservation) -> Decision[RoutingMap]: ...


@runtime_checkable
class RequestRouter(Protocol):
    """A router that also routes request by request (`Capabilities.routes_requests`)."""

    def route_requests(self, window: RequestWindow) -> list[Route]:
        """One route per request of the window, in order (destination, serving model)."""
        ...


@runtime_checkable
class Deployer(Protocol):
    """Tier 2: every slot and node, a placement of LMs on that node."""

    name: str

    def place(self, obs: NodeObservation) -> Decision[Placement]: ...


@runtime_checkable
class FeedbackConsumer(Protocol):
    """Optional: a plugin that learns from completed requests (delayed rewards)."""

    def observe(self, records: Sequence[RequestRecord]) -> None: ...


class Clock(Protocol):
    """Seconds since the run started; virtual in the emulator, wall time on a cluster."""

    def now(self) -> float: ...

    def sleep_until(self, t: float) -> None:
        """Return when the clock reads `t` (the emulator runs its events up to `t`)."""
        ...


class ActuationResult(WireModel):
    """What applying a placement did on one node."""

    node: str
    started: list[str] = Field(default_factory=list)
    stopped: list[str] = Field(default_factory=list)
    resized: list[str] = Field(default_factory=list)
    voided: list[str] = Field(
        default_factory=list,
        description="Resource-adding actions voided because a pod on the node was pending.",
    )
    errors: list[str] = Field(default_factory=list)


class ClusterBackend(Protocol):
    """One world the control plane drives: the emulator or a Kubernetes cluster."""

    clock: Clock

    def context(self) -> ClusterContext:
        """Nodes, services and loop constants in force now (the last `refresh`)."""
        ...

    def refresh(self, slot: int) -> ContextUpdate:
        """Follow the cluster to the boundary of `slot` (a `LiveContext`).

        Called by the loop first thing in every slot. Changes (an LMService
        applied, edited or deleted; a node lost or back; a link changed) take
        effect from this slot on; requests they strand are recorded with an
        explicit outcome (`node_lost`, `lm_removed`) by the next `drain_records`.
        """
        ...

    def snapshot(self, slot: int) -> Snapshot:
        """Per-node per-LM backlog, instances and headroom, now."""
        ...

    def arrivals(self, slot: int) -> list[Arrival]:
        """The (origin, LM) pairs expected to receive requests in `slot`."""
        ...

    def publish_routing(self, slot: int, routing: RoutingMap) -> None:
        """Install the map used for requests arriving during `slot`.

        Requests of a pair in `routing.rejections` are refused on arrival and
        recorded with outcome `rejected` (admission control).
        """
        ...

    def apply_placement(self, placement: Placement) -> ActuationResult:
        """Start, stop or resize model instances on one node (the pending rule applies)."""
        ...

    def drain_records(self) -> list[RequestRecord]:
        """Requests finished (served or timed out) since the last call."""
        ...

    def telemetry(self) -> list[NodeTelemetry]:
        """Current resource-use snapshot per node."""
        ...

    def close(self) -> None: ...
