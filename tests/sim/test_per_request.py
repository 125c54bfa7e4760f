"""Per-request routing in windows on LYREO's setting (examples/lyreo)."""

from __future__ import annotations

from pathlib import Path

import pytest

from lmedge.api import Arrival, RequestWindow, Route, RoutingMap
from lmedge.backends.emulated import EmulatedBackend, load_scenario
from lmedge.bench.runner import RunSpec, run
from lmedge.controller.assembly import PolicyChoice
from lmedge.sim.radio import uplink_s
from tests.sim.conftest import place, run_all

LYREO = Path(__file__).resolve().parents[2] / "examples" / "lyreo"


def test_a_window_shares_each_server_uplink_among_the_requests_it_sent_there() -> None:
    """The slot's map sends every user to its origin; the window sends all to one server,
    whose band the slot's 60 requests then share (each user's uplink at n = 60)."""
    sc = load_scenario(LYREO)
    be = EmulatedBackend(sc, seed=1)
    em = be.emulator
    target = be.context().workers[0].name
    place(be, target, ("llama-1b", "gpu", 2, 1))
    arrivals = be.arrivals(0)
    be.publish_routing(
        0,
        RoutingMap(
            routes=[
                Route(origin=o, lm=lm, destination=o)
                for o, lm in {(a.origin, a.lm) for a in arrivals}
            ]
        ),
    )

    def to_target(window: RequestWindow) -> list[Route]:
        return [Route(origin=r.origin, lm=r.lm, destination=target) for r in window.requests]

    be.route_requests_with(to_target, sc.spec.loop.slot_s, 1024)
    rows = {em._request_id(r): r for r in em._requests(0)}
    lengths = em._lengths_of(0)
    radio = sc.spec.workload.users.radio  # type: ignore[union-attr]
    records = [r for r in run_all(be, 200.0) if r.slot == 0]
    assert len(records) == len(arrivals) == 60
    for rec in records:
        r = rows[rec.id]
        tokens = sum(i for i, _ in lengths[rec.id])
        wait = sc.spec.loop.slot_s - r.offset_s
        assert rec.destination == target
        assert rec.uplink_s == pytest.approx(
            wait + uplink_s(radio, (r.x_m, r.y_m), em._server_at[target], tokens, 60)
        )


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
