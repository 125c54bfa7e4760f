"""The routing map as one gateway sees it: where this node's requests for an LM go.

The controller pushes the slot's `RoutingMap` to every gateway (`PUT
/control/routing`, the paper's FastAPI broadcast, T2.1); the gateway keeps only
the entries whose origin is its own node, in a dict, so a routing decision is
one lookup. An (origin, LM) pair the map does not mention is served locally:
that is the paper's fallback for a slot without a valid map. A destination the
gateway has no address for is reported, not silently replaced.

The map's `rejections` for this node are kept as a set of LMs: a request for
one of them is refused at once (admission control) until the next push, and
`retry_after_s` says how long that is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from lmedge.api.constants import SLOT_S
from lmedge.dataplane.wire import RoutingUpdate

#: Slot length assumed when a push does not carry one, seconds (the paper's 30 s).
DEFAULT_SLOT_S = SLOT_S


@dataclass
class RoutingTable:
    """Destinations (and refusals) of this node's LMs for the current slot.

    `run` is the run id records are written under: the last push's that named
    one. `run_started_at` anchors the run clock (Unix seconds); `None` until the
    controller pushes one, in which case the gateway's start time is used.
    `installed_at` is the monotonic time of the last push and `slot_s` how
    long that map is in force. `tau_s` is the run's deadline once a push
    carried one (None: the gateway's own setting).
    """

    node: str
    run: str = ""
    slot: int = 0
    run_started_at: float | None = None
    slot_s: float = DEFAULT_SLOT_S
    installed_at: float | None = None
    tau_s: float | None = None
    _routes: dict[str, str] = field(default_factory=dict)
    _models: dict[str, str] = field(default_factory=dict)
    _rejected: frozenset[str] = frozenset()

    def update(self, update: RoutingUpdate, now: float | None = None) -> int:
        """Install the slot's map (at monotonic time `now`); return how many entries concern
        this node (routes plus rejections)."""
        routes = {r.lm: r.destination for r in update.routing.routes if r.origin == self.node}
        models = {
            r.lm: r.model
            for r in update.routing.routes
            if r.origin == self.node and r.model is not None
        }
        rejected = frozenset(
            r.lm
            for r in update.routing.rejections
            if r.origin == self.node and r.lm not in routes  # routed wins (never both, validated)
        )
        # One assignment each: a request routed concurrently sees the old or the new map
        # (a race between the two lines can only refuse or admit by the old map once).
        self._routes = routes
        self._models = models
        self._rejected = rejected
        if update.run:
            # A push without a run id (an older controller, a hand-made push) keeps the
            # current one: records must not lose their run.
            self.run = update.run
        self.slot = update.slot
        self.installed_at = now
        if update.slot_s is not None:
            self.slot_s = update.slot_s
        if update.tau_s is not None:
            self.tau_s = update.tau_s
        if update.run_started_at is not None:
            self.run_started_at = update.run_started_at
        return len(routes) + len(rejected)

    def destination(self, lm: str) -> str:
        """The node that serves this node's requests for `lm` (itself when unmapped)."""
        return self._routes.get(lm, self.node)

    def model(self, lm: str) -> str | None:
        """The LM the map chose to serve this node's requests for `lm` (a request class).

        None when the map names none: `lm` itself, or the class's default.
        """
        return self._models.get(lm)

    def rejects(self, lm: str) -> bool:
        """Whether the current map refuses this node's requests for `lm`."""
        return lm in self._rejected

    def retry_after_s(self, now: float) -> int:
        """Whole seconds until the current map's slot ends (at least 1), for `Retry-After`.

        The next push may admit the request; before it, a retry is refused
        again. Without a push time, a whole slot.
        """
        left = self.slot_s if self.installed_at is None else self.installed_at + self.slot_s - now
        return max(1, math.ceil(left))

    def routes(self) -> dict[str, str]:
        """A copy of {lm: destination} for this node."""
        return dict(self._routes)

    def rejected(self) -> list[str]:
        """The LMs this node refuses under the current map, sorted."""
        return sorted(self._rejected)
