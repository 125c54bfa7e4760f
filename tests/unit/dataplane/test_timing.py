"""Stage split and record building: the four stages always add up."""

from __future__ import annotations

import pytest

from lmedge.api.records import RequestOutcome
from lmedge.dataplane.timing import build_record, record_total, split_stages
from lmedge.dataplane.wire import ForwardResult, StageTimes


@pytest.mark.parametrize(
    ("total", "sent", "received", "queue", "inference", "expected"),
    [
        (10.0, 100.0, 101.0, 3.0, 4.0, (1.0, 3.0, 4.0, 2.0)),
        # destination clock behind the origin's: uplink clamps to 0, downlink takes the rest
        (10.0, 100.0, 99.0, 3.0, 4.0, (0.0, 3.0, 4.0, 3.0)),
        # destination clock far ahead: uplink is cut to what the round trip leaves
        (10.0, 100.0, 150.0, 3.0, 4.0, (3.0, 3.0, 4.0, 0.0)),
        # a timeout reported past tau: queue is trimmed, compute time kept
        (900.0, 0.0, 0.5, 905.0, 2.0, (0.0, 898.0, 2.0, 0.0)),
        (0.0, 5.0, 5.0, 0.0, 0.0, (0.0, 0.0, 0.0, 0.0)),
    ],
    ids=["plain", "skew-behind", "skew-ahead", "over-tau", "zero"],
)
def test_split_stages_sums_to_total(
    total: float,
    sent: float,
    received: float,
    queue: float,
    inference: float,
    expected: tuple[float, float, float, float],
) -> None:
    times = split_stages(
        total_s=total, sent_at=sent, received_at=received, queue_s=queue, inference_s=inference
    )
    got = (times.uplink_s, times.queue_s, times.inference_s, times.downlink_s)
    assert got == pytest.approx(expected)
    assert sum(got) == pytest.approx(total)


@pytest.mark.parametrize(
    ("outcome", "error", "expected"),
    [("success", None, 12.0), ("timeout", None, 900.0), ("timeout", "unreachable", 12.0)],
    ids=["success-rtt", "deadline-tau", "failure-rtt"],
)
def test_record_total(outcome: RequestOutcome, error: str | None, expected: float) -> None:
    assert record_total(rtt_s=12.0, outcome=outcome, error=error, tau_s=900.0) == expected


def test_build_record_carries_result_fields() -> None:
    result = ForwardResult(
        id="r1",
        destination="worker-2",
        received_at=1.0,
        queue_s=2.0,
        inference_s=3.0,
        outcome="success",
        conflict=True,
        mode="gpu",
        outputs=[],
    )
    record = build_record(
        request_id="r1",
        run="run-a",
        lm="lm1",
        origin="worker-1",
        prompts=3,
        slot=7,
        submit_s=-0.5,
        times=StageTimes(uplink_s=1, queue_s=2, inference_s=3, downlink_s=4),
        result=result,
    )
    assert record.destination == "worker-2"
    assert record.conflict and record.mode == "gpu" and record.slot == 7
    assert record.submit_s == 0.0  # clamped: the run clock never goes negative
    assert record.latency_s == 10.0
    assert record.prompts_done == 0
