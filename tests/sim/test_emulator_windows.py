"""Request-level routing in the emulator: windows of requests, a route per request.

Services `a` and `b` serve the class `chat`. A router installed with
`route_requests_with` receives the requests arriving in each window of a
slot at the window's end; they leave then (the wait is part of their
uplink). A router that fails, or answers with the wrong number of routes,
leaves its window to the slot's map; no request is lost.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from lmedge.api import PowerProfile, RequestWindow, Route, RoutingMap
from lmedge.api.constants import RADIO_WATTS
from lmedge.backends.emulated import EmulatedBackend
from lmedge.bench.runner import RunSpec, run
from lmedge.controller.assembly import PolicyChoice
from lmedge.sim import Scenario
from lmedge.sim.synthetic import lm_service
from tests.sim.conftest import place, run_all

ROOT = Path(__file__).resolve().parents[2]
ROWS = [(0, "w1", "chat", 1, 0.2), (0, "w3", "chat", 1, 0.7), (0, "w2", "chat", 1, 1.5)]


def services() -> list[dict[str, Any]]:
    out = [lm_service("a", gpu_s=2.0, cpu_s=20.0), lm_service("b", gpu_s=1.0, cpu_s=20.0)]
    for svc in out:
        svc["spec"]["serves"] = ["chat"]
    return out


def backend(make_scenario: Callable[..., Scenario]) -> EmulatedBackend:
    be = EmulatedBackend(make_scenario(ROWS, services=services()), seed=0)
    place(be, "w2", ("b", "gpu", 4, 1))
    place(be, "w1", ("a", "gpu", 4, 1))
    be.publish_routing(
        0,
        RoutingMap(
            routes=[
                Route(origin=o, lm="chat", destination="w1", model="a") for o in ("w1", "w2", "w3")
            ]
        ),
    )
    return be


def test_each_window_is_routed_at_its_end_one_route_per_request(
    make_scenario: Callable[..., Scenario],
) -> None:
    be = backend(make_scenario)
    seen: list[RequestWindow] = []

    def router(window: RequestWindow) -> list[Route]:
        seen.append(window)
        return [
            Route(origin=r.origin, lm=r.lm, destination="w2", model="b") for r in window.requests
        ]

    be.route_requests_with(router, 1.0, 128)
    recs = run_all(be, 1000)
    assert [[r.origin for r in w.requests] for w in seen] == [["w1", "w3"], ["w2"]]
    assert [(w.start_s, w.end_s) for w in seen] == [(0.0, 1.0), (1.0, 2.0)]
    assert sorted((r.origin, r.destination, r.model, r.outcome) for r in recs) == [
        ("w1", "w2", "b", "success"),
        ("w2", "w2", "b", "success"),
        ("w3", "w2", "b", "success"),
    ]
    first = next(r for r in recs if r.origin == "w1")
    network = be.emulator.network.delay("w1", "w2", 1.0)
    assert first.uplink_s == pytest.approx(0.8 + network)  # waited 0.8 s for its window
    assert be.emulator.window_stats["windows"] == 2
    assert be.emulator.window_stats["fallbacks"] == 0


def test_windows_hold_at_most_the_window_requests(make_scenario: Callable[..., Scenario]) -> None:
    be = backend(make_scenario)
    sizes: list[int] = []

    def router(window: RequestWindow) -> list[Route]:
        sizes.append(len(window.requests))
        return [
            Route(origin=r.origin, lm=r.lm, destination="w1", model="a") for r in window.requests
        ]

    be.route_requests_with(router, 30.0, 2)
    assert len(run_all(be, 1000)) == 3
    assert sizes == [2, 1]


@pytest.mark.parametrize(
    "answer",
    [lambda w: 1 / 0, lambda w: []],
    ids=["router-raises", "wrong-number-of-routes"],
)
def test_a_failed_window_keeps_the_slot_map_and_loses_nothing(
    make_scenario: Callable[..., Scenario], answer: Callable[[RequestWindow], list[Route]]
) -> None:
    be = backend(make_scenario)
    be.route_requests_with(answer, 1.0, 128)
    recs = run_all(be, 1000)
    assert sorted((r.origin, r.destination, r.model) for r in recs) == [
        ("w1", "w1", "a"),
        ("w2", "w1", "a"),
        ("w3", "w1", "a"),
    ]
    assert be.emulator.window_stats["fallbacks"] == 2


def test_the_loop_hands_a_request_router_its_windows_and_the_summary_reports_them() -> None:
    out = run(RunSpec(ROOT / "examples" / "model-routing", PolicyChoice("cema-request"), 1, 2))
    windows = out.summary["routing"]["windows"]
    assert windows["windows"] == out.timing["route_windows"] > 0
    assert out.timing["route_window_fallbacks"] == 0
    assert windows["requests"] >= out.summary["requests"]
    assert windows["j_mean"] <= windows["seed_j_mean"] + 1e-9  # the search starts from the seed
    assert out.summary["routing"]["energy_j"] > 0


def test_energy_is_inference_at_busy_power_plus_link_time_not_the_window_wait(
    make_scenario: Callable[..., Scenario],
) -> None:
    be = backend(make_scenario)

    def to_w2(window: RequestWindow) -> list[Route]:
        return [
            Route(origin=r.origin, lm=r.lm, destination="w2", model="b") for r in window.requests
        ]

    be.route_requests_with(to_w2, 1.0, 128)
    recs = {r.origin: r for r in run_all(be, 1000)}
    gpu_watts = PowerProfile().busy_watts_per_gpu
    for origin, wait in (("w1", 0.8), ("w3", 0.3), ("w2", 0.5)):
        r = recs[origin]
        links = r.uplink_s - wait + r.downlink_s
        assert r.energy_j == pytest.approx(r.inference_s * gpu_watts + links * RADIO_WATTS)
