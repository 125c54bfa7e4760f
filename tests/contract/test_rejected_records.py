"""Records of requests refused by admission control, on every store backend.

The server-side `$jsonSchema` validator is generated from `RequestRecord`, so
the outcome `rejected` must pass it, and `lm_stats` must count it as a failure.
"""

from __future__ import annotations

from lmedge.api import RequestRecord
from lmedge.store import Store
from tests.contract import samples


def _refused(run: str, i: int, lm: str) -> RequestRecord:
    return RequestRecord(
        id=f"{run}-x{i}", run=run, lm=lm, origin="w1", destination="w1", prompts=3,
        slot=i, submit_s=float(i), outcome="rejected", mode="none",
    )  # fmt: skip


def test_rejected_records_are_stored_and_counted_as_failures(store: Store) -> None:
    store.record_run(samples.run_info("r1"))
    ok = samples.requests("r1", 8)
    refused = [_refused("r1", i, ok[0].lm) for i in range(3)]
    store.record_requests([*ok, *refused])
    store.flush()
    back = {r.id: r for r in store.requests("r1")}
    assert [back[r.id] for r in refused] == refused, (
        "stored as written, none refused by the validator"
    )
    stats = {s.lm: s for s in store.lm_stats("r1")}
    lm = ok[0].lm
    mine = [r for r in ok if r.lm == lm]
    s = stats[lm]
    assert s.rejected == 3 and s.arrivals == len(mine) + 3
    assert s.successes == sum(r.outcome == "success" for r in mine)
    assert s.success_ratio == s.successes / s.arrivals
    assert all(stats[other].rejected == 0 for other in stats if other != lm)
