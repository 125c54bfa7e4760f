"""Request-level statistics of `lmedge reproduce` against `lmedge.metrics`.

The vectorised objective must equal the paper's metric as `window_metrics`
computes it, degenerate cases included, or the rolling curves and their
bootstrap bands (Figs. 8, 9) would show a different J than the tables.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from lmedge.api import RequestRecord
from lmedge.bench.runner import RequestTable
from lmedge.bench.stats import ROLLING_STEP_SLOTS, Pooled, objectives
from lmedge.metrics import window_metrics

_ids = itertools.count()
LMS = ("lm1", "lm2", "lm3")


def rec(lm: str, ok: bool, latency: float, slot: int = 0, prompts: int = 1) -> RequestRecord:
    return RequestRecord(
        id=f"r{next(_ids)}",
        lm=lm,
        origin="a",
        destination="b",
        prompts=prompts,
        slot=slot,
        submit_s=slot * 30.0,
        inference_s=latency,
        outcome="success" if ok else "timeout",
    )


def table(records: list[RequestRecord], deadlines: dict[str, float]) -> RequestTable:
    index = {lm: k for k, lm in enumerate(LMS)}
    return RequestTable(
        lam=0.5,
        lms=LMS,
        slot=tuple(r.slot for r in records),
        lm=tuple(index[r.lm] for r in records),
        prompts=tuple(r.prompts for r in records),
        success=tuple(r.outcome == "success" for r in records),
        latency_s=tuple(r.latency_s for r in records),
        deadline_s=tuple(deadlines.get(r.lm, 900.0) for r in records),
    )


CASES = {
    "mixed": [
        rec("lm1", True, 10),
        rec("lm1", False, 900),
        rec("lm2", True, 300),
        rec("lm3", True, 5),
    ],
    "nothing served": [rec("lm1", False, 900), rec("lm2", False, 900)],
    "one LM type": [rec("lm2", True, 100), rec("lm2", False, 900)],
    "one LM type, none served": [rec("lm3", False, 900)],
    "an LM without arrivals": [rec("lm1", True, 50), rec("lm3", False, 900), rec("lm3", True, 450)],
    "all served equally": [rec(lm, True, 30.0 * (k + 1)) for k, lm in enumerate(LMS)],
}


@pytest.mark.parametrize("records", list(CASES.values()), ids=list(CASES))
@pytest.mark.parametrize("deadlines", [{}, {"lm2": 600.0}], ids=["tau", "lm2-deadline"])
def test_objective_equals_window_metrics(
    records: list[RequestRecord], deadlines: dict[str, float]
) -> None:
    expected = window_metrics(records, list(LMS), tau_s=900.0, lam=0.5, deadlines=deadlines)
    pooled = Pooled.of([table(records, deadlines)], 0.5)
    assert pooled.objective(0, 1) == pytest.approx(expected.objective, abs=1e-12)


def test_resampled_objectives_are_the_objectives_of_the_resampled_records() -> None:
    records = CASES["mixed"] + CASES["an LM without arrivals"]
    pooled = Pooled.of([table(records, {})], 0.5)
    samples = np.array([[0, 0, 1, 4], [2, 3, 5, 6], [1, 1, 1, 1]])
    got = objectives(pooled.lm, pooled.success, pooled.t_over_deadline, len(LMS), 0.5, samples)
    for row, j in zip(samples, got, strict=True):
        expected = window_metrics([records[i] for i in row], list(LMS), tau_s=900.0, lam=0.5)
        assert j == pytest.approx(expected.objective, abs=1e-12)


def test_rolling_windows_trail_and_their_bands_contain_the_estimate() -> None:
    rng = np.random.default_rng(3)
    records = [
        rec(LMS[int(rng.integers(3))], bool(rng.random() < 0.7), float(rng.uniform(1, 800)), s)
        for s in range(40)
        for _ in range(6)
    ]
    pooled = Pooled.of([table(records, {})], 0.5)
    curve = pooled.rolling(40)
    assert [c["end_slot"] for c in curve] == list(range(ROLLING_STEP_SLOTS, 41, ROLLING_STEP_SLOTS))
    for c in curve:
        end = int(c["end_slot"] or 0)
        assert c["objective"] == pytest.approx(pooled.objective(max(0, end - 30), end), abs=1e-6)
        assert c["lo"] is not None and c["hi"] is not None
        assert c["lo"] <= c["objective"] <= c["hi"]
        assert c["hi"] > c["lo"]  # 60-180 varied requests: the bootstrap spreads
    assert pooled.rolling(40) == curve  # seeded per window: the same band every time


def test_a_window_without_requests_has_no_objective() -> None:
    pooled = Pooled.of([table([rec("lm1", True, 5, slot=25)], {})], 0.5)
    curve = pooled.rolling(30)
    assert curve[0] == {"end_slot": 10, "objective": None, "lo": None, "hi": None}
    assert curve[-1]["objective"] is not None


def test_arrivals_are_prompts_or_requests_per_slot_by_lm_averaged_over_runs() -> None:
    run1 = [rec("lm1", True, 5, slot=s, prompts=2) for s in (0, 1, 2, 12)]
    run1.append(rec("lm3", True, 5, slot=15, prompts=8))
    run2 = [rec("lm1", True, 5, slot=s, prompts=4) for s in (3, 4)]
    pooled = Pooled.of([table(run1, {}), table(run2, {})], 0.5)
    # lm1, slots 0-9: 5 requests, 2+2+2+4+4 = 14 prompts over 2 runs x 10 slots
    assert pooled.arrivals(20, 10, prompts=False) == {
        "lm1": [0.25, 0.05],
        "lm2": [0.0, 0.0],
        "lm3": [0.0, 0.05],
    }
    assert pooled.arrivals(20, 10) == {"lm1": [0.7, 0.1], "lm2": [0.0, 0.0], "lm3": [0.0, 0.4]}


def test_runs_with_different_lm_lists_are_refused() -> None:
    a = table([rec("lm1", True, 5)], {})
    b = RequestTable(0.5, ("lm1",), (0,), (0,), (1,), (True,), (5.0,), (900.0,))
    with pytest.raises(ValueError, match="different LMs"):
        Pooled.of([a, b], 0.5)
