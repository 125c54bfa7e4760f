"""Reading a run's fed request records once each (`Store.requests_after`, `RecordCursor`).

On the embedded store (MontyDB in a temporary folder), the same backend a
`lmedge simulate` run writes to.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from lmedge.api import RequestRecord
from lmedge.errors import StoreUnavailable
from lmedge.store import RecordCursor, Store, open_store
from lmedge.store.documents import FEED, to_document


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
    store.record_requests([_record(i) for i in range(3)], feed=True)
    store.record_requests([_record(0, run="other")], feed=True)
    store.flush()
    assert [r.id for r in store.requests_after(cursor)] == ["r0", "r1", "r2"]
    assert store.requests_after(cursor) == []
    store.record_requests([_record(3), _record(4)], feed=True)
    store.flush()
    assert [r.id for r in store.requests_after(cursor)] == ["r3", "r4"]
    assert [r.id for r in store.requests_after(RecordCursor("other"))] == ["r0"]


def test_only_fed_records_are_read_and_all_stay_stored(store: Store) -> None:
    store.record_requests([_record(1)])  # the controller's own copy: not fed
    store.record_requests([_record(2)], feed=True)
    store.flush()
    assert [r.id for r in store.requests_after(RecordCursor("run-1"))] == ["r2"]
    assert [r.id for r in store.requests("run-1")] == ["r1", "r2"]


def test_a_late_record_is_read_once(store: Store) -> None:
    cursor = RecordCursor("run-1")
    store.record_requests([_record(1)], feed=True)
    store.flush()
    assert [r.id for r in store.requests_after(cursor)] == ["r1"]
    # a gateway's record, stamped 10 min before the newest one read, lands now
    late = to_document(_record(2))
    late["_seq"] -= 600 * 10**9
    store._backend.insert(FEED, [late])
    assert [r.id for r in store.requests_after(cursor)] == ["r2"]
    assert store.requests_after(cursor) == []


def test_the_feed_holds_only_what_is_not_read(store: Store) -> None:
    cursor = RecordCursor("run-1")
    for i in range(5):
        store.record_requests([_record(i)], feed=True)
        store.flush()
        assert [r.id for r in store.requests_after(cursor)] == [f"r{i}"]
    assert store._backend.count(FEED, {}) == 0, "the feed does not grow with the run"
    assert cursor.unconfirmed == set()


def test_a_failed_removal_never_returns_a_record_twice(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    cursor = RecordCursor("run-1")
    store.record_requests([_record(1)], feed=True)
    store.flush()

    def away(collection: str, ids: object) -> int:
        raise StoreUnavailable("the server went away")

    with monkeypatch.context() as m:
        m.setattr(store._backend, "delete", away)
        assert [r.id for r in store.requests_after(cursor)] == ["r1"]
    assert cursor.unconfirmed == {"run-1:worker-1:r1"}
    store.record_requests([_record(2)], feed=True)
    store.flush()
    assert [r.id for r in store.requests_after(cursor)] == ["r2"]
    assert cursor.unconfirmed == set() and store._backend.count(FEED, {}) == 0
