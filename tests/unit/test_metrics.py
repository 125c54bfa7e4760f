"""The paper's metrics against hand-computed values (§III, Tables II and III)."""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Any

import pytest

from lmedge.api import (
    ActuationResult,
    Decision,
    LMPlacement,
    Placement,
    RequestRecord,
    RoutingMap,
)
from lmedge.metrics import (
    audit_counts,
    conflict_stats,
    fairness,
    jain,
    objective,
    reconfiguration_stats,
    segment_metrics,
    t_norm,
    window_metrics,
)

_ids = itertools.count()
TESTBED = Path(__file__).resolve().parents[2] / "examples" / "testbed"


def rec(
    lm: str,
    ok: bool = True,
    latency: float = 10.0,
    slot: int = 0,
    origin: str = "a",
    destination: str = "b",
    conflict: bool = False,
    queue: float | None = None,
) -> RequestRecord:
    """A record whose stage times sum to `latency`; `queue` defaults to half of it."""
    q = latency / 2 if queue is None else queue
    return RequestRecord(
        id=f"r{next(_ids)}",
        lm=lm,
        origin=origin,
        destination=destination,
        prompts=1,
        slot=slot,
        submit_s=slot * 30.0,
        uplink_s=(latency - q) / 2,
        queue_s=q,
        inference_s=(latency - q) / 2,
        outcome="success" if ok else "timeout",
        conflict=conflict,
    )


@pytest.mark.parametrize(
    ("ratios", "f", "f_norm"),
    [
        ([1.0, 1.0, 1.0, 1.0], 1.0, 1.0),
        ([0.5, 0.5], 1.0, 1.0),
        ([1.0, 0.0], 0.5, 0.0),
        ([1.0, 0.0, 0.0, 0.0], 0.25, 0.0),
        # (1 + .5)^2 / (2 (1 + .25)) = 2.25 / 2.5 = 0.9; (0.9 - .5) / .5 = 0.8
        ([1.0, 0.5], 0.9, 0.8),
        # (1+1+.5)^2 / (3 * 2.25) = 6.25 / 6.75; norm = (f - 1/3) / (2/3)
        ([1.0, 1.0, 0.5], 6.25 / 6.75, (6.25 / 6.75 - 1 / 3) / (2 / 3)),
        ([0.0, 0.0, 0.0], 1 / 3, 0.0),
        ([0.7], 1.0, 1.0),
        ([0.0], 1.0, 0.0),
        ([], None, None),
    ],
    ids=[
        "all-one",
        "all-equal",
        "one-starved-of-two",
        "one-served-of-four",
        "one-and-half",
        "three-types",
        "all-zero-is-worst",
        "single-type",
        "single-type-starved",
        "no-types",
    ],
)
def test_fairness(ratios: list[float], f: float | None, f_norm: float | None) -> None:
    got_f, got_norm = fairness(ratios)
    assert got_f == pytest.approx(f)
    assert got_norm == pytest.approx(f_norm)


def test_jain_is_undefined_for_zero_vector_and_empty() -> None:
    assert jain([0.0, 0.0]) is None
    assert jain([]) is None
    assert jain([0.2, 0.2, 0.2]) == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("latencies", "deadlines", "expected"),
    [
        ([90.0, 180.0], [900.0, 900.0], 0.15),
        ([90.0, 90.0], [900.0, 90.0], 0.55),
        ([], [], 1.0),
    ],
    ids=["mean-ratio", "per-lm-deadline", "no-success-is-worst"],
)
def test_t_norm(latencies: list[float], deadlines: list[float], expected: float) -> None:
    assert t_norm(latencies, deadlines) == pytest.approx(expected)


def test_t_norm_rejects_mismatched_lengths() -> None:
    with pytest.raises(ValueError, match="length"):
        t_norm([1.0], [])


@pytest.mark.parametrize(
    ("tn", "fn", "lam", "expected"),
    [(0.2, 1.0, 0.5, 0.1), (0.0, 0.0, 0.5, 0.5), (1.0, 0.0, 0.5, 1.0), (0.4, 0.6, 0.25, 0.4)],
    ids=["perfect-fairness", "zero-latency-unfair", "worst", "custom-lambda"],
)
def test_objective(tn: float, fn: float, lam: float, expected: float) -> None:
    assert objective(tn, fn, lam) == pytest.approx(expected)


def test_window_metrics_hand_computed() -> None:
    # lm1: 2 of 2 succeed (90 s, 270 s); lm2: 1 of 2 (180 s); lm3 listed, no arrivals.
    records = [
        rec("lm1", latency=90.0),
        rec("lm1", latency=270.0),
        rec("lm2", latency=180.0),
        rec("lm2", ok=False, latency=900.0),
    ]
    m = window_metrics(records, ["lm1", "lm2", "lm3"])
    assert m.requests == 4
    assert m.successes == 3
    assert [s.lm for s in m.per_lm] == ["lm1", "lm2", "lm3"]
    assert [s.arrivals for s in m.per_lm] == [2, 2, 0]
    assert [s.success_ratio for s in m.per_lm] == [1.0, 0.5, None]
    assert [s.mean_latency_s for s in m.per_lm] == [180.0, 180.0, None]
    assert m.mean_latency_s == pytest.approx(180.0)
    # lm3 is left out of Jain: I = 2 with rho = (1, .5)
    assert m.jain == pytest.approx(0.9)
    assert m.f_norm == pytest.approx(0.8)
    assert m.t_norm == pytest.approx((0.1 + 0.3 + 0.2) / 3)
    assert m.objective == pytest.approx(0.5 * 0.2 + 0.5 * 0.2)


def test_window_metrics_uses_per_lm_deadlines() -> None:
    m = window_metrics([rec("lm1", latency=90.0)], ["lm1"], deadlines={"lm1": 180.0})
    assert m.t_norm == pytest.approx(0.5)


def test_window_with_no_success_has_worst_objective() -> None:
    m = window_metrics([rec("lm1", ok=False), rec("lm2", ok=False)], ["lm1", "lm2"])
    assert m.successes == 0
    assert m.mean_latency_s is None
    assert m.t_norm == 1.0
    assert m.f_norm == 0.0
    assert m.objective == pytest.approx(1.0)


def test_empty_window_lists_every_lm_and_no_aggregates() -> None:
    m = window_metrics([], ["lm1", "lm2"])
    assert [(s.lm, s.arrivals, s.success_ratio) for s in m.per_lm] == [
        ("lm1", 0, None),
        ("lm2", 0, None),
    ]
    assert (m.requests, m.jain, m.f_norm, m.t_norm, m.objective) == (0, None, None, None, None)


def test_lm_missing_from_the_list_is_kept() -> None:
    m = window_metrics([rec("lm9")], ["lm1"])
    assert [s.lm for s in m.per_lm] == ["lm1", "lm9"]
    assert m.requests == 1


def test_window_conflict_ratio_counts_cross_node_requests() -> None:
    records = [
        rec("lm1", conflict=True),
        rec("lm1"),
        rec("lm1", origin="b", destination="b", conflict=True),
    ]
    assert window_metrics(records, ["lm1"]).conflict_ratio == pytest.approx(0.5)


def test_segment_windows_and_means() -> None:
    records = [
        rec("lm1", slot=0, latency=90.0),
        rec("lm2", slot=1, ok=False),
        rec("lm1", slot=2, latency=180.0),
        rec("lm2", slot=3, latency=180.0),
        # slots 4-5 empty, slot 6 in the last (short) window
        rec("lm1", slot=6, latency=270.0),
        rec("lm1", slot=9, latency=1.0),  # outside [0, 7)
    ]
    seg = segment_metrics(records, ["lm1", "lm2"], window_slots=2, end_slot=7)
    assert len(seg.windows) == 4
    assert [w.requests for w in seg.windows] == [2, 2, 0, 1]
    w0, w1, w2, w3 = seg.windows
    assert w0.jain == pytest.approx(0.5)
    assert w0.f_norm == 0.0
    assert w1.jain == pytest.approx(1.0)
    assert w2.objective is None
    assert w3.jain == pytest.approx(1.0)  # one type with arrivals
    assert seg.overall.requests == 5
    assert seg.overall.successes == 4
    assert seg.window_mean_jain == pytest.approx((0.5 + 1.0 + 1.0) / 3)
    assert seg.window_mean_latency_s == pytest.approx((90.0 + 180.0 + 270.0) / 3)
    w_obj = [w.objective for w in seg.windows if w.objective is not None]
    assert seg.window_mean_objective == pytest.approx(sum(w_obj) / 3)


def test_segment_defaults_to_the_last_slot_and_validates_window() -> None:
    seg = segment_metrics([rec("lm1", slot=4)], ["lm1"], window_slots=3)
    assert (seg.end_slot, len(seg.windows)) == (5, 2)
    assert segment_metrics([], ["lm1"], window_slots=3).windows == []
    with pytest.raises(ValueError, match="window_slots"):
        segment_metrics([], ["lm1"], window_slots=0)


def test_conflict_stats_table_ii() -> None:
    records = [
        rec("lm1", conflict=True, latency=200.0, queue=100.0),
        rec("lm1", conflict=True, ok=False, latency=900.0, queue=500.0),
        rec("lm1", latency=50.0, queue=20.0),
        rec("lm1", latency=50.0, queue=40.0),
        rec("lm1", origin="b", destination="b", conflict=True, queue=7.0),  # local
    ]
    c = conflict_stats(records)
    assert (c.scope, c.requests, c.conflicts) == ("cross-node", 4, 2)
    assert c.ratio == pytest.approx(0.5)
    # the timed-out conflict counts tau = 900 s, not its recorded 500 s
    assert c.conflict_queue_delay_s == pytest.approx((100.0 + 900.0) / 2)
    assert c.non_conflict_queue_delay_s == pytest.approx(30.0)
    assert c.conflict_timeout_ratio == pytest.approx(0.5)
    everything = conflict_stats(records, cross_node_only=False)
    assert (everything.requests, everything.conflicts) == (5, 3)


def test_conflict_stats_without_requests() -> None:
    c = conflict_stats([])
    assert (c.ratio, c.conflict_queue_delay_s, c.conflict_timeout_ratio) == (None, None, None)


def place(node: str, **modes: str) -> Placement:
    return Placement(
        node=node,
        lms=[
            LMPlacement(
                lm=lm,
                mode=mode,
                cpu_cores=0 if mode == "off" else 4,
                vgpus=1 if mode == "gpu" else 0,
            )
            for lm, mode in modes.items()
        ],
    )


def act(node: str, started: str = "", stopped: str = "", resized: str = "") -> ActuationResult:
    return ActuationResult(
        node=node, started=started.split(), stopped=stopped.split(), resized=resized.split()
    )


def test_reconfiguration_table_iii_counts_actuated_events() -> None:
    actuations = [
        act("w1", started="lm1"),  # a cold node's first start is an activation
        act("w2", started="lm2"),
        act("w1", started="lm2"),  # +lm2
        act("w2"),  # no change
        act("w1", stopped="lm2", resized="lm1"),  # -lm2; lm1 gpu->cpu is a resize
        ActuationResult(node="w2", voided=["lm1"]),  # decided, voided: no event
        act("w2", started="lm1", stopped="lm2"),
    ]
    s = reconfiguration_stats(actuations, lms=["lm1", "lm2", "lm3"])
    assert (s.decisions, s.transitions, s.set_changes) == (7, 5, 5)
    assert s.set_change_ratio == pytest.approx(5 / 7)
    rows = {r.lm: (r.activations, r.deactivations, r.resizes) for r in s.per_lm}
    assert rows == {"lm1": (2, 0, 1), "lm2": (2, 2, 0), "lm3": (0, 0, 0)}
    assert (s.total.activations, s.total.deactivations, s.total.resizes) == (4, 2, 1)
    assert s.total.activations_per_100 == pytest.approx(100 * 4 / 7)
    assert s.total.resizes_per_100 == pytest.approx(100 / 7)
    lm2 = next(r for r in s.per_lm if r.lm == "lm2")
    assert lm2.deactivations_per_100 == pytest.approx(100 * 2 / 7)


def test_reconfiguration_counts_what_the_emulator_did_not_what_was_decided() -> None:
    from lmedge.backends.emulated.backend import EmulatedBackend
    from lmedge.sim import load_scenario

    backend = EmulatedBackend(load_scenario(TESTBED), seed=1)
    starts = place("worker-2", lm3="gpu")
    both = place("worker-2", lm3="gpu", lm4="gpu")
    # lm3's pod is still starting when lm4 is asked for: the pending rule voids it.
    actuations = [backend.apply_placement(starts), backend.apply_placement(both)]
    assert actuations[1].voided == ["lm4"]
    s = reconfiguration_stats(actuations, lms=["lm3", "lm4"])
    rows = {r.lm: r.activations for r in s.per_lm}
    assert rows == {"lm3": 1, "lm4": 0}, "two LMs were decided, one was started"
    assert (s.decisions, s.transitions) == (2, 1)


def test_reconfiguration_of_nothing() -> None:
    s = reconfiguration_stats([])
    assert (s.decisions, s.total.activations_per_100, s.set_change_ratio) == (0, None, None)


def test_audit_counts_by_agent_and_source() -> None:
    routing = RoutingMap(routes=[])
    decisions: list[Decision[Any]] = [
        Decision[RoutingMap](agent="scheduler", policy="agentic", source="llm", value=routing),
        Decision[RoutingMap](
            agent="scheduler",
            policy="agentic",
            source="llm",
            value=routing,
            validated=False,
            outcome="replaced",
        ),
        Decision[RoutingMap](
            agent="scheduler",
            policy="local",
            source="fallback",
            value=routing,
            parsed=False,
            validated=False,
            outcome="replaced",
            error="timeout",
        ),
        Decision[Placement](
            agent="deployer", policy="lyapunov", source="rule", value=place("w1", lm1="off")
        ),
    ]
    rows = [
        (r.agent, r.source, r.calls, r.parsed, r.validated, r.accepted, r.replaced, r.errors)
        for r in audit_counts(decisions)
    ]
    assert rows == [
        ("scheduler", "*", 3, 2, 1, 1, 2, 1),
        ("scheduler", "fallback", 1, 0, 0, 0, 1, 1),
        ("scheduler", "llm", 2, 2, 1, 1, 1, 0),
        ("deployer", "*", 1, 1, 1, 1, 0, 0),
        ("deployer", "rule", 1, 1, 1, 1, 0, 0),
    ]


def test_twenty_thousand_records_segment_into_finite_metrics() -> None:
    # The speed of this is measured in benchmarks/test_metrics_bench.py.
    records = [
        rec(
            f"lm{i % 4 + 1}",
            ok=i % 7 != 0,
            latency=float(i % 900),
            slot=i // 96,
            conflict=i % 13 == 0,
        )
        for i in range(20_000)
    ]
    seg = segment_metrics(records, ["lm1", "lm2", "lm3", "lm4"], window_slots=10)
    assert seg.overall.requests == 20_000
    assert math.isfinite(seg.overall.objective or math.nan)
    assert len(seg.windows) == math.ceil((20_000 // 96 + 1) / 10)


def test_metric_rows_give_the_metrics_of_their_records() -> None:
    from lmedge.api import RequestRecord
    from lmedge.metrics import MetricRow, window_metrics

    def rec(i: int, lm: str, outcome: str, conflict: bool, dest: str) -> RequestRecord:
        return RequestRecord(
            id=f"r{i}", run="x", lm=lm, origin="w1", destination=dest, prompts=1,
            prompts_done=1 if outcome == "success" else 0, slot=0, submit_s=0.0,
            uplink_s=0.1 * i, queue_s=0.3 + i, inference_s=1.7, downlink_s=0.05,
            outcome=outcome, conflict=conflict,
        )  # fmt: skip

    records = [
        rec(1, "a", "success", False, "w2"),
        rec(2, "a", "timeout", True, "w2"),
        rec(3, "b", "success", True, "w3"),
        rec(4, "b", "rejected", False, "w1"),
        rec(5, "c", "success", False, "w1"),
    ]
    rows = [MetricRow.of(r) for r in records]
    deadlines = {"a": 30.0, "b": 60.0}
    assert window_metrics(rows, ["a", "b"], tau_s=90.0, deadlines=deadlines) == window_metrics(
        records, ["a", "b"], tau_s=90.0, deadlines=deadlines
    )
    assert rows[2].latency_s == records[2].latency_s
