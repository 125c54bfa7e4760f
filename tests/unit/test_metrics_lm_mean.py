"""LM-mean latency: the paper's headline latency, next to the request-weighted mean."""

from __future__ import annotations

import itertools

import pytest

from lmedge.api import RequestRecord
from lmedge.api.records import RequestOutcome
from lmedge.metrics import segment_metrics, window_metrics

_ids = itertools.count()


def rec(lm: str, outcome: RequestOutcome, latency: float, slot: int = 0) -> RequestRecord:
    return RequestRecord(
        id=f"r{next(_ids)}",
        lm=lm,
        origin="a",
        destination="b",
        prompts=1,
        slot=slot,
        submit_s=slot * 30.0,
        queue_s=latency,
        outcome=outcome,
    )


def test_lm_mean_is_the_unweighted_mean_of_the_per_lm_means() -> None:
    # The paper's MILP figures: LM1-LM3 fast and many, LM4 slow and few.
    records = (
        [rec("lm1", "success", 8.0)] * 9
        + [rec("lm2", "success", 12.6)] * 9
        + [rec("lm3", "success", 7.2)] * 9
        + [rec("lm4", "success", 877.7)]
    )
    m = window_metrics(records, ["lm1", "lm2", "lm3", "lm4"])
    assert m.lm_mean_latency_s == pytest.approx((8.0 + 12.6 + 7.2 + 877.7) / 4)
    assert m.mean_latency_s == pytest.approx((9 * (8.0 + 12.6 + 7.2) + 877.7) / 28)
    assert m.lm_mean_latency_s > 5 * m.mean_latency_s


def test_an_lm_with_no_success_counts_at_its_deadline() -> None:
    """Starving an LM must not lower the LM-mean (leaving it out would)."""
    served = [rec("lm1", "success", 10.0), rec("lm2", "success", 30.0)]
    starved = [*served, rec("lm3", "timeout", 900.0), rec("lm3", "timeout", 900.0)]
    m = window_metrics(starved, ["lm1", "lm2", "lm3"], tau_s=900.0, deadlines={"lm3": 600.0})
    assert m.lm_mean_latency_s == pytest.approx((10.0 + 30.0 + 600.0) / 3)
    assert m.mean_latency_s == pytest.approx(20.0)
    assert m.lm_mean_latency_s > window_metrics(served, ["lm1", "lm2"]).lm_mean_latency_s


def test_lms_without_arrivals_are_left_out_and_no_requests_give_none() -> None:
    m = window_metrics([rec("lm1", "success", 10.0)], ["lm1", "lm2"])
    assert m.lm_mean_latency_s == pytest.approx(10.0)
    assert window_metrics([], ["lm1", "lm2"]).lm_mean_latency_s is None


def test_segment_windows_carry_their_own_lm_mean_and_its_mean() -> None:
    records = [
        rec("lm1", "success", 10.0, slot=0),
        rec("lm2", "success", 50.0, slot=0),
        rec("lm1", "success", 20.0, slot=1),
        rec("lm2", "timeout", 900.0, slot=1),
    ]
    seg = segment_metrics(records, ["lm1", "lm2"], window_slots=1, end_slot=3)
    assert [w.lm_mean_latency_s for w in seg.windows] == [
        pytest.approx(30.0),
        pytest.approx((20.0 + 900.0) / 2),
        None,
    ]
    assert seg.window_mean_lm_mean_latency_s == pytest.approx((30.0 + 460.0) / 2)
    assert seg.overall.lm_mean_latency_s == pytest.approx((15.0 + 50.0) / 2)
