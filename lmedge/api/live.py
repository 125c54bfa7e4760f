"""The live cluster context: what changed between two slot boundaries.

A cluster is not static: an LMService is applied, edited or deleted, a node
dies, is cordoned or comes back, a link slows down. Both backends (the
Kubernetes one, following the API server with a watch cache, and the emulator,
replaying a scenario's timeline of cluster events) report such changes through
one interface, `LiveContext.update(slot)`, called by the control loop and by
every node agent at the start of a slot. Changes take effect at that slot
boundary, never in the middle of a slot.

Requests that a change strands end with an explicit outcome (see
`lmedge.api.records.RequestOutcome`): `node_lost` for requests queued or in
flight at a node that went away, `lm_removed` for requests of an LMService that
was deleted. None silently vanishes.
"""

from __future__ import annotations

from typing import Literal, Protocol

from pydantic import Field

from lmedge.api.base import WireModel
from lmedge.api.observations import ClusterContext

ChangeKind = Literal[
    "lm_added",
    "lm_edited",
    "lm_removed",
    "node_added",
    "node_edited",
    "node_removed",
    "node_down",
    "node_up",
    "link_changed",
]

#: Changes after which the standing macro policy may name what no longer exists
#: or miss what now does: the loop re-plans at once (audited with the reason).
REPLAN_KINDS: frozenset[ChangeKind] = frozenset(
    {"lm_added", "lm_edited", "lm_removed", "node_added", "node_removed", "node_down", "node_up"}
)


class ContextChange(WireModel):
    """One change of the cluster, as a person would read it in the audit."""

    kind: ChangeKind
    name: str = Field(description="The LMService or node; a link is 'a->b'.")
    detail: str = Field(default="", description="Why, in words (e.g. 'Node NotReady').")


class ContextUpdate(WireModel):
    """The context in force from `slot` on, and what changed to get there."""

    slot: int = Field(ge=0)
    context: ClusterContext
    changes: list[ContextChange] = Field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.changes)

    @property
    def needs_replan(self) -> bool:
        return any(c.kind in REPLAN_KINDS for c in self.changes)


class LiveContext(Protocol):
    """A source of the cluster context that follows changes (both backends)."""

    def update(self, slot: int) -> ContextUpdate:
        """The context at the boundary of `slot` and the changes since the last call.

        Cheap when nothing changed (no API round trip on the Kubernetes side:
        the watch cache answers). The first call returns the initial context
        with no changes.
        """
        ...
