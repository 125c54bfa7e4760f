"""FIFO queues, inactive-target conflicts and the deadline tau."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from lmedge.backends.emulated import EmulatedBackend
from lmedge.sim import Scenario
from tests.sim.conftest import place, route, run_all


def test_prompt_sets_are_served_in_arrival_order(make_scenario: Callable[..., Scenario]) -> None:
    sc = make_scenario([(0, "w1", "a", 2, 2.0), (0, "w2", "a", 1, 3.0), (0, "w3", "a", 1, 4.0)])
    be = EmulatedBackend(sc, seed=0)
    place(be, "w1", ("a", "gpu", 4, 1))
    route(be, 0, ("w1", "a", "w1"), ("w2", "a", "w1"), ("w3", "a", "w1"))
    recs = {r.origin: r for r in run_all(be, 200)}
    assert [r.outcome for r in recs.values()] == ["success"] * 3
    first, second, third = recs["w1"], recs["w2"], recs["w3"]
    # one prompt = 10 s on an uncontended vGPU; each set starts when the previous one ends
    assert first.inference_s == pytest.approx(20.0)
    assert second.submit_s + second.uplink_s + second.queue_s == pytest.approx(22.0)
    assert third.submit_s + third.uplink_s + third.queue_s == pytest.approx(32.0)
    assert second.inference_s == pytest.approx(10.0) == third.inference_s
    assert not any(r.conflict for r in recs.values())


def test_request_to_inactive_lm_waits_and_succeeds_when_activated(
    make_scenario: Callable[..., Scenario],
) -> None:
    sc = make_scenario([(0, "w1", "a", 1, 0.0), (0, "w2", "b", 1, 0.0)])
    be = EmulatedBackend(sc, seed=0)
    route(be, 0, ("w1", "a", "w2"), ("w2", "b", "w2"))
    be.clock.sleep_until(30.0)
    assert be.snapshot(1).node("w2").backlog == {"a": 1, "b": 1, "g": 0}
    place(be, "w2", ("a", "gpu", 4, 1))  # activated only in slot 1
    recs = {r.lm: r for r in run_all(be, 2000)}
    a, b = recs["a"], recs["b"]
    assert a.conflict and a.outcome == "success" and a.mode == "gpu"
    assert a.queue_s == pytest.approx(31.0, abs=0.01)  # waited for slot 1 + ~1 s cold start
    assert b.conflict and b.outcome == "timeout" and b.mode == "none"
    assert b.latency_s == pytest.approx(900.0) and b.prompts_done == 0


def test_request_to_active_lm_is_no_conflict(make_scenario: Callable[..., Scenario]) -> None:
    sc = make_scenario([(0, "w1", "a", 1, 5.0)])
    be = EmulatedBackend(sc, seed=0)
    place(be, "w1", ("a", "cpu", 4, 0))
    (rec,) = run_all(be, 100)
    assert not rec.conflict and rec.mode == "cpu" and rec.inference_s == pytest.approx(20.0)


def test_timeout_at_tau_keeps_progress_and_frees_the_pod(
    make_scenario: Callable[..., Scenario],
) -> None:
    sc = make_scenario([(0, "w1", "a", 8, 0.0), (1, "w2", "a", 1, 1.0)], loop={"tauS": 60})
    be = EmulatedBackend(sc, seed=0)
    place(be, "w1", ("a", "gpu", 4, 1))
    route(be, 0, ("w1", "a", "w1"))
    be.clock.sleep_until(30.0)
    route(be, 1, ("w2", "a", "w1"))
    recs = {r.origin: r for r in run_all(be, 500)}
    big, small = recs["w1"], recs["w2"]
    assert big.outcome == "timeout"
    assert big.latency_s == pytest.approx(60.0, abs=1e-9)
    assert big.done_s == pytest.approx(60.0)
    assert big.prompts_done == 5  # ready at ~1 s, then one prompt per 10 s until t = 60
    assert big.queue_s == pytest.approx(1.0, abs=0.01)
    # the pod drops the expired set at t = 60 and serves the next one at once
    assert small.outcome == "success"
    assert small.submit_s + small.uplink_s + small.queue_s == pytest.approx(60.0)


def test_per_service_deadline_overrides_tau(make_scenario: Callable[..., Scenario]) -> None:
    from lmedge.sim.synthetic import lm_service
    from tests.sim.conftest import default_services

    services = [
        *default_services()[:2],
        lm_service("g", gpu_s=4.0, runs_on="gpu-only", deadline_s=5.0),
    ]
    sc = make_scenario([(0, "w1", "g", 2, 0.0)], services=services)
    be = EmulatedBackend(sc, seed=0)
    place(be, "w1", ("g", "gpu", 4, 1))
    (rec,) = run_all(be, 100)
    assert rec.outcome == "timeout" and rec.latency_s == pytest.approx(5.0)
    assert rec.prompts_done == 1


def test_a_pending_pod_counts_as_active_no_conflict(
    make_scenario: Callable[..., Scenario],
) -> None:
    be = EmulatedBackend(make_scenario([(0, "w1", "a", 1, 0.5)]), seed=0)
    place(be, "w1", ("a", "gpu", 4, 1))  # pending until ~1 s; the request arrives at 0.5 s
    (rec,) = run_all(be, 100)
    assert not rec.conflict and rec.queue_s == pytest.approx(0.5, abs=0.01)
