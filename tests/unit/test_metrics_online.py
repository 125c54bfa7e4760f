"""The running forms of the metrics: stranding as the run goes, penalized latency, quantiles."""

from __future__ import annotations

import pytest

from lmedge.api import ActuationResult, RequestRecord
from lmedge.api.observations import LMStats
from lmedge.bench.tally import QuantileTally
from lmedge.metrics import (
    StrandedTally,
    lm_mean_latency,
    lm_mean_penalized_latency,
    penalized_latency,
    stranded_requests,
)


def rec(rid: str, lm: str, dest: str, slot: int, outcome: str = "timeout") -> RequestRecord:
    return RequestRecord.model_validate(
        {
            "id": rid,
            "lm": lm,
            "origin": "a",
            "destination": dest,
            "prompts": 2,
            "slot": slot,
            "submit_s": slot * 30.0,
            "outcome": outcome,
        }
    )


# (slot, actuation) in the order the loop applies them
ACTUATIONS = [
    (0, ActuationResult(node="w1", started=["lm1"])),
    (1, ActuationResult(node="w1", stopped=["lm1"])),
    (3, ActuationResult(node="w2", started=["lm2"])),
    (6, ActuationResult(node="w1", started=["lm1"])),
]
# (slot it was drained at, request): lm1's horizon is 3 slots (90 s / 30 s)
FINISHED = [
    (1, rec("hosted-at-arrival", "lm1", "w1", 0)),
    (2, rec("started-later", "lm2", "w2", 1)),  # lm2 starts on w2 at slot 3: pending until then
    (4, rec("stranded", "lm1", "w1", 2)),  # lm1 is back on w1 at 6, after its horizon 2..5
    (5, rec("started-in-time", "lm1", "w1", 3)),  # horizon 3..6: lm1 back at 6
    (5, rec("never", "lm2", "w1", 4)),
    (5, rec("served", "lm1", "w1", 4, outcome="success")),
]
DEADLINES = {"lm1": 90.0, "lm2": 900.0}


def test_stranding_as_the_run_goes_is_the_batch_answer() -> None:
    tally = StrandedTally(DEADLINES, 30.0, keep=True)
    acts = iter(ACTUATIONS)
    pending = next(acts)
    for slot in range(8):
        while pending is not None and pending[0] == slot:
            tally.placed(*pending)
            pending = next(acts, None)
        tally.advance(slot)
        for _, r in (f for f in FINISHED if f[0] == slot):
            tally.finished(r, slot)
        if slot == 2:  # lm2's request waits: its horizon is not over and lm2 never ran yet
            assert [r.id for r, _, _ in tally.pending] == ["started-later"]
    tally.close()
    batch = stranded_requests(
        [r for _, r in FINISHED],
        [a for _, a in ACTUATIONS],
        [s for s, _ in ACTUATIONS],
        DEADLINES,
        30.0,
    )
    assert tally.found is not None
    assert sorted(r.id for r in tally.found) == sorted(r.id for r in batch) == ["never", "stranded"]
    assert tally.count == 2 and tally.pending == []


def test_actuations_out_of_slot_order_are_refused() -> None:
    tally = StrandedTally(DEADLINES, 30.0)
    tally.placed(3, ActuationResult(node="w1"))
    with pytest.raises(ValueError, match="slot 2 after one of slot 3"):
        tally.placed(2, ActuationResult(node="w1"))


def _stats(lm: str, arrivals: int, successes: int, mean: float | None) -> LMStats:
    return LMStats(
        lm=lm,
        arrivals=arrivals,
        successes=successes,
        success_ratio=successes / arrivals if arrivals else None,
        mean_latency_s=mean,
    )


@pytest.mark.parametrize(
    ("stats", "expected"),
    [
        (_stats("a", 4, 4, 10.0), 10.0),
        (_stats("a", 4, 2, 10.0), (2 * 10.0 + 2 * 100.0) / 4),
        (_stats("a", 4, 0, None), 100.0),
        (_stats("a", 0, 0, None), None),
    ],
    ids=["all-served", "half-failed", "none-served", "no-arrivals"],
)
def test_a_failed_request_counts_at_its_deadline(stats: LMStats, expected: float | None) -> None:
    assert penalized_latency(stats, 100.0) == expected


def test_refusing_work_cannot_look_faster() -> None:
    # `refuses` serves only its fastest requests; `serves` serves them all, slower
    refuses = [_stats("a", 10, 2, 5.0), _stats("b", 10, 10, 20.0)]
    serves = [_stats("a", 10, 10, 40.0), _stats("b", 10, 10, 20.0)]
    deadlines = {"a": 900.0, "b": 900.0}
    # served-only, the refusing profile looks faster; with failures at tau it is not
    assert lm_mean_latency(refuses, deadlines) == 12.5 < lm_mean_latency(serves, deadlines) == 30.0
    assert lm_mean_penalized_latency(refuses, deadlines) == (721.0 + 20.0) / 2
    assert lm_mean_penalized_latency(serves, deadlines) == 30.0


def test_quantiles_are_exact_up_to_the_bound_then_the_memory_stops_growing() -> None:
    exact = QuantileTally(limit=1000)
    xs = [float((i * 37) % 101) for i in range(999)]
    for x in xs:
        exact.add(x)
    s = sorted(xs)
    assert exact.quantile(0.5) == s[499] and exact.quantile(0.99) == s[989]
    assert exact.mean() == pytest.approx(sum(xs) / len(xs))
    sampled = QuantileTally(limit=1000)
    for i in range(100_000):
        sampled.add(float(i))
    assert len(sampled.values) < 1000 and sampled.count == 100_000
    assert sampled.mean() == pytest.approx(49_999.5)
    assert sampled.quantile(0.5) == pytest.approx(50_000, rel=0.01)
