"""Activation: cold start, the pending rule, resize-as-restart, resumption."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from lmedge.api import LMPlacement, Placement
from lmedge.backends.emulated import EmulatedBackend
from lmedge.sim import Scenario
from tests.sim.conftest import place, route, run_all


def _p(node: str, *lms: tuple[str, str, float, int]) -> Placement:
    return Placement(
        node=node,
        lms=[LMPlacement(lm=lm, mode=m, cpu_cores=c, vgpus=v) for lm, m, c, v in lms],  # type: ignore[arg-type]
    )


def test_pending_pod_voids_resource_adding_actions_but_not_removals(
    make_scenario: Callable[..., Scenario],
) -> None:
    be = EmulatedBackend(make_scenario(), seed=0)
    first = be.apply_placement(_p("w2", ("a", "gpu", 4, 1), ("b", "cpu", 4, 0)))
    assert first.started == ["a", "b"] and not first.voided  # one decision may start several
    assert be.snapshot(0).node("w2").pending
    # while a and b are pending: adding g and resizing a are voided, stopping b applies
    second = be.apply_placement(
        _p("w2", ("a", "gpu", 8, 1), ("b", "off", 0, 0), ("g", "gpu", 4, 1))
    )
    assert second.voided == ["a", "g"]
    assert second.stopped == ["b"] and not second.started and not second.resized
    inst = {i.lm: i for i in be.snapshot(0).node("w2").instances}
    assert set(inst) == {"a"} and inst["a"].cpu_cores == 4 and inst["a"].status == "pending"
    # the same shape for a pending pod is no action, so nothing is voided
    assert not be.apply_placement(_p("w2", ("a", "gpu", 4, 1))).voided
    # other nodes are unaffected
    assert be.apply_placement(_p("w1", ("g", "gpu", 4, 1))).started == ["g"]
    be.clock.sleep_until(2.0)
    assert not be.snapshot(0).node("w2").pending
    third = be.apply_placement(_p("w2", ("a", "gpu", 4, 1), ("g", "gpu", 4, 1)))
    assert third.started == ["g"] and not third.voided


def test_capacity_and_mode_errors_are_reported_not_applied(
    make_scenario: Callable[..., Scenario],
) -> None:
    be = EmulatedBackend(make_scenario(), seed=0)
    res = be.apply_placement(_p("w3", ("g", "cpu", 4, 0), ("a", "cpu", 30, 0), ("b", "gpu", 4, 1)))
    assert not res.started and len(res.errors) == 3
    text = " | ".join(res.errors)
    assert "g runs on GPU only" in text and "w3 has no GPU" in text
    assert "a: 30 cores do not fit" in text
    res = be.apply_placement(_p("w1", ("a", "gpu", 4, 1), ("b", "gpu", 4, 1), ("g", "gpu", 4, 1)))
    assert res.started == ["a", "b"] and "vGPUs" in res.errors[0]
    assert be.apply_placement(_p("nowhere", ("a", "cpu", 4, 0))).errors


def test_resize_restarts_the_pod_with_a_cold_start(make_scenario: Callable[..., Scenario]) -> None:
    be = EmulatedBackend(make_scenario([(0, "w3", "a", 2, 5.0)]), seed=0)
    place(be, "w3", ("a", "cpu", 4, 0))
    be.clock.sleep_until(10.0)  # first prompt in service since t = 5 (20 s on 4 cores)
    res = be.apply_placement(_p("w3", ("a", "cpu", 8, 0)))
    assert res.resized == ["a"] and not res.started
    (inst,) = be.snapshot(0).node("w3").instances
    assert inst.status == "pending" and inst.cpu_cores == 8
    (rec,) = run_all(be, 200)
    # 5 s of lost work, ~1 s cold start, then 2 prompts x 15 s on 8 cores
    assert rec.outcome == "success" and rec.prompts_done == 2
    assert rec.inference_s == pytest.approx(5.0 + 30.0)
    assert rec.queue_s == pytest.approx(1.0, abs=0.01)
    assert be.emulator.stats["prompts_lost"] == 1


def test_a_swap_lands_because_every_replaced_pod_goes_first(
    make_scenario: Callable[..., Scenario],
) -> None:
    """As a cluster's reconciler (`pods.plan_node`): the resized pods are all stopped
    before any starts, so a pod may take what another one, resized in the same
    placement, gives up, whatever their order in it."""
    be = EmulatedBackend(make_scenario(), seed=0)
    place(be, "w1", ("a", "gpu", 4, 1), ("b", "gpu", 4, 1))  # both of w1's vGPUs
    be.clock.sleep_until(10.0)
    res = be.apply_placement(_p("w1", ("a", "gpu", 4, 2), ("b", "cpu", 4, 0)))
    assert not res.errors and sorted(res.resized) == ["a", "b"]
    inst = {i.lm: i for i in be.snapshot(0).node("w1").instances}
    assert (inst["a"].mode, inst["a"].vgpus) == ("gpu", 2)
    assert (inst["b"].mode, inst["b"].vgpus) == ("cpu", 0)


def test_deactivation_mid_set_resumes_without_losing_or_repeating_prompts(
    make_scenario: Callable[..., Scenario],
) -> None:
    rows = [(0, "w1", "a", 8, 0.0), (0, "w2", "a", 1, 0.5), (0, "w1", "b", 3, 0.0)]
    be = EmulatedBackend(make_scenario(rows), seed=0)
    place(be, "w1", ("a", "gpu", 4, 1))
    route(be, 0, ("w2", "a", "w1"))
    be.clock.sleep_until(25.0)  # ready at ~1 s; prompts done at ~11 and ~21, third in flight
    assert be.snapshot(0).node("w1").backlog["a"] == 6 + 1
    place(be, "w1", ("a", "off", 0, 0))
    assert be.snapshot(0).node("w1").backlog["a"] == 6 + 1  # kept, the set back at the head
    be.clock.sleep_until(40.0)
    place(be, "w1", ("a", "gpu", 4, 1))
    be.clock.sleep_until(45.0)
    place(be, "w1", ("a", "off", 0, 0))  # a second interruption, mid-prompt again
    be.clock.sleep_until(50.0)
    place(be, "w1", ("a", "gpu", 4, 1))
    recs = {(r.origin, r.lm): r for r in run_all(be, 1000)}
    a, later = recs[("w1", "a")], recs[("w2", "a")]
    assert a.outcome == "success" and a.prompts_done == a.prompts == 8
    stats = be.emulator.stats
    # every completion is counted once: 8 + 1 prompts of a, none run twice, none lost
    assert stats["prompts_done"] == 9 and stats["prompts_lost"] == 2
    assert recs[("w1", "b")].outcome == "timeout" and recs[("w1", "b")].prompts_done == 0
    # inference: ~24 s before the stop, ~4 s lost after the restart, then 6 x 10 s
    assert a.inference_s == pytest.approx(24.0 + 4.0 + 60.0, abs=0.02)
    assert a.latency_s == pytest.approx(a.done_s - a.submit_s)
    # the interrupted set resumed first: the later set starts when it ends (~111 s)
    assert later.submit_s + later.uplink_s + later.queue_s == pytest.approx(111.0, abs=0.02)


def test_cold_start_delays_the_first_prompt(make_scenario: Callable[..., Scenario]) -> None:
    be = EmulatedBackend(
        make_scenario([(0, "w1", "a", 1, 0.0)], emulation={"coldStart": {}}), seed=3
    )
    place(be, "w1", ("a", "gpu", 4, 1))
    (rec,) = run_all(be, 100)
    assert 0.0 < rec.queue_s <= 13.58  # paper's cold-start maximum
    assert rec.queue_s == pytest.approx(rec.latency_s - 10.0)
