"""Reading a run's request records incrementally (`Store.requests_after`, `RecordCursor`).

On the embedded store (MontyDB in a temporary folder), the same backend a
`lmedge simulate` run writes to.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from lmedge.api import RequestRecord
from lmedge.store import RecordCursor, Store, open_store
from lmedge.store.documents import to_document


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = open_store(str(tmp_path / "store"))
    yield s
    s.close()


def _record(i: int, run: str = "run-1") -> RequestRecord:
    return RequestRecord(
        id=f"r{i}",
        run=run,
        lm="lm1",
        origin="worker-1",
        destination="worker-1",
        prompts=1,
        slot=0,
        submit_s=float(i),
        outcome="success",
    )


def test_each_record_is_read_once_in_order(store: Store) -> None:
    cursor = RecordCursor("run-1")
    assert store.requests_after(cursor) == [], "a run without records yet is no error"
    store.record_requests([_record(i) for i in range(3)])
    store.record_requests([_record(0, run="other")])
    store.flush()
    assert [r.id for r in store.requests_after(cursor)] == ["r0", "r1", "r2"]
    assert store.requests_after(cursor) == []
    store.record_requests([_record(3), _record(4)])
    store.flush()
    assert [r.id for r in store.requests_after(cursor)] == ["r3", "r4"]


def test_a_late_record_within_the_lookback_is_read_once(store: Store) -> None:
    cursor = RecordCursor("run-1", lookback_s=60)
    store.record_requests([_record(1)])
    store.flush()
    assert [r.id for r in store.requests_after(cursor)] == ["r1"]
    # a gateway's record, stamped 10 s before the newest one read, lands now
    late = to_document(_record(2))
    late["_seq"] = cursor.seq - 10 * 10**9
    store._backend.insert("requests", [late])
    assert [r.id for r in store.requests_after(cursor)] == ["r2"]
    assert store.requests_after(cursor) == []


def test_the_cursor_forgets_what_fell_out_of_the_lookback(store: Store) -> None:
    cursor = RecordCursor("run-1", lookback_s=1e-6)
    for i in range(5):
        store.record_requests([_record(i)])
        store.flush()
        assert [r.id for r in store.requests_after(cursor)] == [f"r{i}"]
    assert len(cursor.recent) <= 1, "what it remembers does not grow with the run"
