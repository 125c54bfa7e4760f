"""The routing table keeps this node's routes and falls back to local service."""

from __future__ import annotations

from lmedge.api.decisions import Route, RoutingMap
from lmedge.dataplane.routing import RoutingTable
from lmedge.dataplane.wire import RoutingUpdate


def _update(
    slot: int, *routes: tuple[str, str, str], started: float | None = None
) -> RoutingUpdate:
    return RoutingUpdate(
        run="r",
        slot=slot,
        run_started_at=started,
        routing=RoutingMap(routes=[Route(origin=o, lm=lm, destination=d) for o, lm, d in routes]),
    )


def test_unmapped_lm_is_served_locally() -> None:
    table = RoutingTable(node="worker-1")
    assert table.destination("lm1") == "worker-1"


def test_update_keeps_only_own_routes_and_replaces_previous() -> None:
    table = RoutingTable(node="worker-1")
    n = table.update(
        _update(3, ("worker-1", "lm1", "worker-2"), ("worker-2", "lm1", "worker-3"), started=50.0)
    )
    assert n == 1
    assert table.destination("lm1") == "worker-2"
    assert (table.run, table.slot, table.run_started_at) == ("r", 3, 50.0)
    table.update(_update(4, ("worker-1", "lm2", "worker-5")))
    assert table.destination("lm1") == "worker-1"  # the new slot's map no longer routes lm1
    assert table.destination("lm2") == "worker-5"
    assert table.run_started_at == 50.0  # kept when a push omits it


def test_a_push_without_a_run_keeps_the_current_run() -> None:
    table = RoutingTable(node="worker-1")
    table.update(_update(1, ("worker-1", "lm1", "worker-2")))
    anonymous = _update(2, ("worker-1", "lm1", "worker-3")).model_copy(update={"run": ""})
    table.update(anonymous)
    assert (table.run, table.slot, table.destination("lm1")) == ("r", 2, "worker-3")
