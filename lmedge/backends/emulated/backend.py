"""`EmulatedBackend`: the emulator behind the `ClusterBackend` protocol.

The controller drives this exactly as it drives the Kubernetes backend; only
the clock differs (`SimClock`: `sleep_until(t)` runs the emulation to `t`).
All behaviour lives in `lmedge.sim` (its `engine`); this adapter only fixes the
public surface, so the engine can change without touching the controller.
"""

from __future__ import annotations

from collections.abc import Callable

from lmedge.api.decisions import Placement, Route, RoutingMap
from lmedge.api.interfaces import ActuationResult, Clock, ClusterBackend
from lmedge.api.live import ContextUpdate
from lmedge.api.observations import Arrival, ClusterContext, RequestWindow, Snapshot
from lmedge.api.records import NodeTelemetry, RequestRecord
from lmedge.sim.clock import SimClock
from lmedge.sim.engine import Emulator
from lmedge.sim.scenario import Scenario


class EmulatedBackend:
    """One emulated cluster: `EmulatedBackend(load_scenario(path), seed=0)`.

    Same scenario + seed + decisions -> byte-identical records. Requests of
    slot t arrive during [t * slotS, (t + 1) * slotS) and follow the routing
    map published for slot t; pairs the map leaves out (or routes to a node
    that cannot host the LM) go local when the origin can host the LM, else
    to the nearest feasible worker; pairs it rejects are recorded `rejected`
    the moment they arrive. A scenario's timeline changes the cluster at slot
    boundaries (`refresh`); requests it strands end `node_lost` or `lm_removed`.
    """

    def __init__(self, scenario: Scenario, seed: int = 0) -> None:
        self.scenario = scenario
        self.seed = seed
        self.emulator = Emulator(scenario, seed)
        self.clock: Clock = SimClock(self.emulator.env)

    def context(self) -> ClusterContext:
        """The cluster in force now: nodes up, LMs in force (the scenario's timeline)."""
        return self.emulator.ctx

    def refresh(self, slot: int) -> ContextUpdate:
        """Apply the scenario's timeline up to `slot` and report what changed since the last call.

        The emulator applies each event at its slot boundary by itself as well,
        so a caller that never refreshes still sees the same cluster physics.
        """
        self.emulator.advance(slot)
        self.emulator.prepare(slot)
        return ContextUpdate(
            slot=slot, context=self.emulator.ctx, changes=self.emulator.take_changes()
        )

    def snapshot(self, slot: int) -> Snapshot:
        return self.emulator.snapshot(slot)

    def arrivals(self, slot: int) -> list[Arrival]:
        return self.emulator.arrivals(slot)

    def publish_routing(self, slot: int, routing: RoutingMap) -> None:
        self.emulator.publish_routing(slot, routing)

    def route_requests_with(
        self, router: Callable[[RequestWindow], list[Route]], window_s: float, most: int
    ) -> None:
        """Route each request in windows through `router` (`Emulator.route_requests_with`)."""
        self.emulator.route_requests_with(router, window_s, most)

    def apply_placement(self, placement: Placement) -> ActuationResult:
        """Start, stop or resize pods on one node; LMs the placement omits are left as they are."""
        return self.emulator.apply_placement(placement)

    def drain_records(self) -> list[RequestRecord]:
        return self.emulator.drain_records()

    def telemetry(self) -> list[NodeTelemetry]:
        return self.emulator.telemetry()

    def close(self) -> None:
        """Nothing to release: the emulation lives in memory and ends with the object."""


def _implements_cluster_backend(backend: EmulatedBackend) -> ClusterBackend:
    """Static check (mypy) that `EmulatedBackend` satisfies the protocol."""
    return backend
