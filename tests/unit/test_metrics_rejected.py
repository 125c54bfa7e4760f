"""`rejected` (admission control) in the metrics: a failure that cannot help the objective."""

from __future__ import annotations

import itertools

import pytest

from lmedge.api import RequestRecord
from lmedge.api.records import RequestOutcome
from lmedge.metrics import conflict_stats, segment_metrics, share, window_metrics

_ids = itertools.count()


def rec(
    lm: str,
    outcome: RequestOutcome,
    latency: float = 10.0,
    slot: int = 0,
    origin: str = "a",
    destination: str = "b",
    conflict: bool = False,
) -> RequestRecord:
    return RequestRecord(
        id=f"r{next(_ids)}",
        lm=lm,
        origin=origin,
        destination=destination,
        prompts=1,
        slot=slot,
        submit_s=slot * 30.0,
        queue_s=latency,
        outcome=outcome,
        conflict=conflict,
    )


def refused(lm: str, slot: int = 0) -> RequestRecord:
    """A record as the emulator and the gateway write it for a refused request."""
    return rec(lm, "rejected", latency=0.0, slot=slot, origin="a", destination="a")


def _workload(failed: str) -> list[RequestRecord]:
    """lm1: 3 served, 1 failed; lm2: 1 served, 3 failed; `failed` is how they failed."""
    out = [rec("lm1", "success", 20.0) for _ in range(3)] + [rec("lm2", "success", 40.0)]
    for lm, n in (("lm1", 1), ("lm2", 3)):
        for _ in range(n):
            out.append(refused(lm) if failed == "rejected" else rec(lm, "timeout", 900.0))
    return out


def test_rejected_counts_as_a_failure_in_every_metric() -> None:
    """Refusing instead of timing out changes no success ratio, Jain or objective."""
    rejected = window_metrics(_workload("rejected"), ["lm1", "lm2"])
    timed_out = window_metrics(_workload("timeout"), ["lm1", "lm2"])
    assert rejected.requests == timed_out.requests == 8
    assert rejected.successes == timed_out.successes == 4
    assert [s.success_ratio for s in rejected.per_lm] == [0.75, 0.25]
    for field in ("jain", "f_norm", "t_norm", "objective", "mean_latency_s"):
        assert getattr(rejected, field) == pytest.approx(getattr(timed_out, field)), field
    assert rejected.rejected == 4 and timed_out.rejected == 0
    assert [s.rejected for s in rejected.per_lm] == [1, 3]


def test_rejecting_everything_is_the_worst_objective() -> None:
    m = window_metrics([refused("lm1"), refused("lm2")], ["lm1", "lm2"])
    assert m.successes == 0 and m.rejected == 2
    assert m.objective == pytest.approx(1.0), "no success: T_norm = 1 and F_norm = 0"


@pytest.mark.parametrize("cross_node_only", [True, False], ids=["cross-node", "all"])
def test_a_rejected_request_is_not_a_conflict(cross_node_only: bool) -> None:
    recs = [
        rec("lm1", "success", origin="a", destination="b"),
        rec("lm1", "timeout", 900.0, origin="a", destination="b", conflict=True),
        refused("lm1"),
        # even a record claiming a conflict is out of scope once rejected
        rec("lm1", "rejected", 0.0, origin="a", destination="b", conflict=True),
    ]
    c = conflict_stats(recs, cross_node_only=cross_node_only)
    assert (c.requests, c.conflicts) == (2, 1)
    assert c.conflict_timeout_ratio == 1.0


def test_rejected_per_window() -> None:
    recs = [refused("lm1", slot=0), rec("lm1", "success", slot=1), rec("lm1", "success", slot=10)]
    seg = segment_metrics(recs, ["lm1"], 10)
    assert [w.rejected for w in seg.windows] == [1, 0]
    assert seg.overall.rejected == 1
    assert share(seg.overall.rejected, seg.overall.requests) == pytest.approx(1 / 3)
    assert share(0, 0) is None
