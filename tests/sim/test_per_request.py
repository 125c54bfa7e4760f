"""Per-request routing (RoutingMap.assignments) and LYREO's setting (examples/lyreo)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from lmedge.api import Arrival, Assignment, Route, RoutingMap, check_routing_map
from lmedge.backends.emulated import EmulatedBackend, load_scenario
from lmedge.bench.runner import RunSpec, run
from lmedge.controller.assembly import PolicyChoice
from lmedge.sim import Scenario
from tests.sim.conftest import place, run_all

LYREO = Path(__file__).resolve().parents[2] / "examples" / "lyreo"


def test_an_assignment_overrides_the_pair_route(make_scenario: Callable[..., Scenario]) -> None:
    rows = [(0, "w1", "a", 1, 0.0), (0, "w3", "a", 1, 0.0)]
    be = EmulatedBackend(make_scenario(rows), seed=0)
    arrivals = be.arrivals(0)
    assert [a.request for a in arrivals] == ["0-0-w1-a", "0-0-w3-a"]
    place(be, "w1", ("a", "gpu", 4, 1))
    place(be, "w2", ("a", "gpu", 4, 1))
    routing = RoutingMap(
        routes=[
            Route(origin="w1", lm="a", destination="w1"),
            Route(origin="w3", lm="a", destination="w1"),
        ],
        assignments=[Assignment(request="0-0-w3-a", destination="w2")],
    )
    assert check_routing_map(routing, be.context(), arrivals) == []
    be.publish_routing(0, routing)
    dest = {r.id: r.destination for r in run_all(be, 500.0)}
    assert dest == {"0-0-w1-a": "w1", "0-0-w3-a": "w2"}


def test_assignments_are_checked(make_scenario: Callable[..., Scenario]) -> None:
    be = EmulatedBackend(make_scenario([(0, "w1", "a", 1, 0.0)]), seed=0)
    arrivals = be.arrivals(0)
    ok = RoutingMap(routes=[], assignments=[Assignment(request="0-0-w1-a", destination="w2")])
    assert check_routing_map(ok, be.context(), arrivals) == []
    bad = RoutingMap(
        routes=[],
        assignments=[
            Assignment(request="nope", destination="w2"),
            Assignment(request="0-0-w1-a", destination="elsewhere"),
        ],
    )
    why = [v.message for v in check_routing_map(bad, be.context(), arrivals)]
    assert any("no arrival this slot is request 'nope'" in m for m in why)
    assert any("unknown destination node 'elsewhere'" in m for m in why)


@pytest.fixture(scope="module")
def lyreo_runs() -> dict[str, dict[str, object]]:
    out = {}
    for profile in ("lyreo-ly", "ll-count"):
        spec = RunSpec(LYREO, PolicyChoice(profile=profile), seed=1, slots=20, settle=False)
        out[profile] = run(spec).summary
    return out


def test_users_send_one_request_each_slot_over_the_radio() -> None:
    sc = load_scenario(LYREO)
    be = EmulatedBackend(sc, seed=1)
    arrivals: list[Arrival] = be.arrivals(0)
    users = sc.spec.workload.users
    assert users is not None and len(arrivals) == users.count
    assert all(a.request and "-u" in a.request and a.input_tokens for a in arrivals)


def test_every_lyreo_profile_summary_has_the_balance_metrics(
    lyreo_runs: dict[str, dict[str, object]],
) -> None:
    for summary in lyreo_runs.values():
        balance = summary["balance"]
        assert isinstance(balance, dict)
        assert 0 < balance["slots"] <= 20  # without settle slots the last boundary is unread
        assert 0 < balance["mean_latency_s"] <= balance["p99_latency_s"]
        assert balance["mean_deviation"] is not None and balance["mean_deviation"] >= 0
        assert summary["success_ratio"] == pytest.approx(1.0, abs=0.05)
