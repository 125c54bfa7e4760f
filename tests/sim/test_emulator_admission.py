"""Admission control in the emulator: a rejected pair is refused on arrival."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from lmedge.api import Rejection, Route, RoutingMap
from lmedge.backends.emulated import EmulatedBackend
from lmedge.sim import Scenario
from tests.sim.conftest import place, run_all


def test_rejected_pair_is_recorded_at_once_and_takes_no_service(
    make_scenario: Callable[..., Scenario],
) -> None:
    # w1's set for `a` is rejected; w2's set for `a` is routed to the same pod.
    sc = make_scenario([(0, "w1", "a", 3, 2.0), (0, "w2", "a", 1, 4.0)])
    be = EmulatedBackend(sc, seed=0)
    place(be, "w1", ("a", "gpu", 4, 1))
    be.publish_routing(
        0,
        RoutingMap(
            routes=[Route(origin="w2", lm="a", destination="w1")],
            rejections=[Rejection(origin="w1", lm="a")],
        ),
    )
    be.clock.sleep_until(3.0)
    (refused,) = be.drain_records()  # recorded the moment it arrived, long before tau
    assert refused.outcome == "rejected" and refused.origin == "w1"
    assert refused.destination == "w1" and refused.mode == "none"
    assert refused.submit_s == pytest.approx(2.0) and refused.latency_s == 0.0
    assert refused.prompts == 3 and refused.prompts_done == 0 and not refused.conflict
    assert be.snapshot(0).node("w1").backlog["a"] == 0, "a refused set holds no queue place"
    (served,) = run_all(be, 200)
    # the routed set starts when it arrives (~4 s + uplink): nothing was queued ahead of it
    assert served.outcome == "success" and served.origin == "w2"
    assert served.queue_s == pytest.approx(0.0, abs=0.01)


def test_rejection_applies_to_its_slot_only(make_scenario: Callable[..., Scenario]) -> None:
    sc = make_scenario([(0, "w1", "a", 1, 1.0), (1, "w1", "a", 1, 1.0)])
    be = EmulatedBackend(sc, seed=0)
    place(be, "w1", ("a", "gpu", 4, 1))
    be.publish_routing(0, RoutingMap(routes=[], rejections=[Rejection(origin="w1", lm="a")]))
    be.clock.sleep_until(30.0)
    be.publish_routing(1, RoutingMap(routes=[Route(origin="w1", lm="a", destination="w1")]))
    recs = sorted(run_all(be, 300), key=lambda r: r.slot)
    assert [(r.slot, r.outcome) for r in recs] == [(0, "rejected"), (1, "success")]
