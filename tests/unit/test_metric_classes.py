"""`metric_lms`: the per-LM list of the metrics when request classes arrive."""

from __future__ import annotations

import pytest

from lmedge.api import RequestRecord
from lmedge.metrics import metric_lms, window_metrics
from tests.unit.policies.lyapunov.scenario import paper_testbed


def rec(lm: str, model: str | None = None, outcome: str = "success") -> RequestRecord:
    return RequestRecord.model_validate(
        {
            "id": f"{lm}-{model}",
            "lm": lm,
            "model": model,
            "origin": "worker-1",
            "destination": "worker-2",
            "prompts": 1,
            "slot": 0,
            "submit_s": 0.0,
            "outcome": outcome,
        }
    )


@pytest.mark.parametrize(
    ("records", "expected"),
    [
        ([], ["lm1", "lm2", "lm3", "lm4"]),
        ([rec("lm1"), rec("lm3")], ["lm1", "lm2", "lm3", "lm4"]),
        ([rec("text-generation", "lm2"), rec("lm3")], ["lm3", "lm4", "text-generation"]),
        (
            [rec("text-generation", "lm1"), rec("lm2")],
            ["lm2", "lm3", "lm4", "text-generation"],
        ),
    ],
    ids=["none", "lms-only", "class", "class-and-a-served-lm"],
)
def test_metric_lms(records: list[RequestRecord], expected: list[str]) -> None:
    assert metric_lms(paper_testbed(), records) == expected


def test_class_rows_count_the_class_requests() -> None:
    ctx = paper_testbed()
    recs = [rec("text-generation", "lm1"), rec("text-generation", "lm2", "timeout")]
    m = window_metrics(recs, metric_lms(ctx, recs), tau_s=900.0)
    row = next(s for s in m.per_lm if s.lm == "text-generation")
    assert (row.arrivals, row.successes) == (2, 1)
    assert [s.lm for s in m.per_lm] == ["lm3", "lm4", "text-generation"]
