"""The routing map as one gateway sees it: where this node's requests for an LM go.

The controller pushes the slot's `RoutingMap` to every gateway (`PUT
/control/routing`, the paper's FastAPI broadcast, T2.1); the gateway keeps only
the entries whose origin is its own node, in a dict, so a routing decision is
one lookup. An (origin, LM) pair the map does not mention is served locally:
that is the paper's fallback for a slot without a valid map. A destination the
gateway has no address for is reported, not silently replaced.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lmedge.dataplane.wire import RoutingUpdate


@dataclass
class RoutingTable:
    """Destinations of this node's LMs for the current slot.

    `run_started_at` anchors the run clock (Unix seconds); `None` until the
    controller pushes one, in which case the gateway's start time is used.
    """

    node: str
    run: str = ""
    slot: int = 0
    run_started_at: float | None = None
    _routes: dict[str, str] = field(default_factory=dict)

    def update(self, update: RoutingUpdate) -> int:
        """Install the slot's map; return how many routes concern this node."""
        routes = {r.lm: r.destination for r in update.routing.routes if r.origin == self.node}
        # One assignment: a request being routed concurrently sees the old or the new map.
        self._routes = routes
        self.run = update.run
        self.slot = update.slot
        if update.run_started_at is not None:
            self.run_started_at = update.run_started_at
        return len(routes)

    def destination(self, lm: str) -> str:
        """The node that serves this node's requests for `lm` (itself when unmapped)."""
        return self._routes.get(lm, self.node)

    def routes(self) -> dict[str, str]:
        """A copy of {lm: destination} for this node."""
        return dict(self._routes)
