"""Reading a run's fed request records once each (`Store.requests_after`, `RecordCursor`).

On the embedded store (MontyDB in a temporary folder), the same backend a
`lmedge simulate` run writes to.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lmedge.api import RequestRecord
from lmedge.errors import StoreUnavailable
from lmedge.store import RecordCursor, Store, StoreOptions, open_store
from lmedge.store.documents import FEED, feed_documents, to_document


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
    # a gateway's batch, stamped 10 min before the newest one read, lands now
    (late,) = feed_documents([to_document(_record(2))], batch_size=500)
    late["_seq"] -= 600 * 10**9
    store._backend.insert(FEED, [late])
    assert [r.id for r in store.requests_after(cursor)] == ["r2"]
    assert store.requests_after(cursor) == []


def test_a_record_fed_on_its_own_by_an_older_gateway_is_read(store: Store) -> None:
    # before batching, each fed record was a feed document of its own
    store._backend.insert(FEED, [to_document(_record(1))])
    store.record_requests([_record(2)], feed=True)
    store.flush()
    cursor = RecordCursor("run-1")
    assert [r.id for r in store.requests_after(cursor)] == ["r1", "r2"]
    assert store.requests_after(cursor) == [] and store._backend.count(FEED, {}) == 0


def test_records_fed_in_several_batches_are_read_once_each_in_order(tmp_path: Path) -> None:
    with open_store(str(tmp_path / "store"), options=StoreOptions(batch_size=4)) as store:
        cursor = RecordCursor("run-1")
        store.record_requests([_record(i) for i in range(10)], feed=True)  # batches 4, 4, 2
        store.record_requests([_record(10), _record(11, run="other")], feed=True)
        store.flush()
        assert store._backend.count(FEED, {"run": "run-1"}) == 4
        assert [r.id for r in store.requests_after(cursor)] == [f"r{i}" for i in range(11)]
        assert store.requests_after(cursor) == []
        assert [r.id for r in store.requests_after(RecordCursor("other"))] == ["r11"]


def test_a_record_fed_again_while_unread_is_read_once(store: Store) -> None:
    store.record_requests([_record(1), _record(2)], feed=True)
    store.record_requests([_record(1), _record(2)], feed=True)  # the same batch: a replay
    store.record_requests([_record(2), _record(3)], feed=True)  # another batch holding r2
    store.flush()
    assert store._backend.count(FEED, {}) == 2
    assert [r.id for r in store.requests_after(RecordCursor("run-1"))] == ["r1", "r2", "r3"]
    assert store.buffer_stats().lost == 0


def test_a_feed_document_that_cannot_be_decoded_does_not_stop_the_read(store: Store) -> None:
    store.record_requests([_record(1)], feed=True)
    store.flush()
    (bad,) = feed_documents([to_document(_record(2))], batch_size=500)
    bad["records"] = bad["records"][:-3]  # truncated
    store._backend.insert(FEED, [bad])
    store.record_requests([_record(3)], feed=True)
    store.flush()
    cursor = RecordCursor("run-1")
    assert [r.id for r in store.requests_after(cursor)] == ["r1", "r3"]
    assert store._backend.count(FEED, {}) == 0, "the bad document is removed, not read again"


def test_a_record_that_does_not_validate_is_skipped_and_its_batch_read(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    docs = [to_document(_record(i)) for i in range(3)]
    docs[1]["prompts"] = "four"  # written by something else than lmedge
    store._backend.insert(FEED, feed_documents(docs, batch_size=500))
    cursor = RecordCursor("run-1")
    assert [r.id for r in store.requests_after(cursor)] == ["r0", "r2"]
    assert "not a valid RequestRecord" in caplog.text
    assert store.requests_after(cursor) == []


def test_fed_records_spilled_while_the_store_was_away_are_read_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    options = StoreOptions(buffer_limit=2, spill_dir=tmp_path / "spill", retry_interval_s=0)
    with open_store(str(tmp_path / "store"), options=options) as store:

        def away(collection: str, docs: object) -> object:
            raise StoreUnavailable("the server went away")

        with monkeypatch.context() as m:
            m.setattr(store._backend, "insert", away)
            for i in range(0, 6, 2):
                store.record_requests([_record(i), _record(i + 1)], feed=True)
        assert store.buffer_stats().spilled > 0
        store.flush()
        assert [r.id for r in store.requests_after(RecordCursor("run-1"))] == [
            f"r{i}" for i in range(6)
        ]
        assert store.buffer_stats().lost == 0


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
    store.record_requests([_record(1), _record(2)], feed=True)
    store.record_requests([_record(3)], feed=True)
    store.flush()
    batches = {d["_id"] for d in store._backend.find(FEED, {})}

    def away(collection: str, ids: object) -> int:
        raise StoreUnavailable("the server went away")

    with monkeypatch.context() as m:
        m.setattr(store._backend, "delete", away)
        assert [r.id for r in store.requests_after(cursor)] == ["r1", "r2", "r3"]
        assert cursor.unconfirmed == batches
        store.record_requests([_record(4)], feed=True)
        store.flush()
        assert [r.id for r in store.requests_after(cursor)] == ["r4"], "still away"
    store.record_requests([_record(5)], feed=True)
    store.flush()
    assert [r.id for r in store.requests_after(cursor)] == ["r5"]
    assert cursor.unconfirmed == set() and store._backend.count(FEED, {}) == 0


def test_with_background_flush_the_removal_leaves_the_read_and_nothing_is_read_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The removal of what a read returned is sent by the background thread; a read
    that overlaps it (its find saw the documents, the removal is confirmed before
    it looks at them) still skips them."""
    options = StoreOptions(spill_dir=tmp_path / "spill", background_flush=True)
    with open_store(str(tmp_path / "store"), options=options) as store:
        cursor = RecordCursor("run-1")
        delete, find = store._backend.delete, store._backend.find
        sending, go = threading.Event(), threading.Event()

        def held_delete(collection: str, ids: Any) -> int:
            sending.set()
            assert go.wait(30)
            return delete(collection, ids)

        def overlapping_find(collection: str, filter: Any, **kw: Any) -> Iterator[Any]:
            docs = list(find(collection, filter, **kw))
            go.set()  # the removal of the first read is confirmed now, after this find
            deadline = time.monotonic() + 30
            while cursor.unconfirmed and time.monotonic() < deadline:
                time.sleep(0.01)
            yield from docs

        store.record_requests([_record(1)], feed=True)
        store.flush()
        monkeypatch.setattr(store._backend, "delete", held_delete)
        assert [r.id for r in store.requests_after(cursor)] == ["r1"]
        store.record_requests([_record(2)], feed=True)  # wakes the background thread
        assert sending.wait(30), "the background thread sends the removal after the writes"
        store.flush()  # r2, had the thread woken by its timer before it was written
        with monkeypatch.context() as m:
            m.setattr(store._backend, "find", overlapping_find)
            assert [r.id for r in store.requests_after(cursor)] == ["r2"]
        store.flush()  # the removals still queued
        assert store._backend.count(FEED, {}) == 0 and cursor.unconfirmed == set()
        assert store.requests_after(cursor) == []


def test_close_removes_what_was_read(tmp_path: Path) -> None:
    options = StoreOptions(spill_dir=tmp_path / "spill", background_flush=True)
    with open_store(str(tmp_path / "store"), options=options) as store:
        store.record_requests([_record(i) for i in range(3)], feed=True)
        store.flush()
        assert len(store.requests_after(RecordCursor("run-1"))) == 3
    with open_store(str(tmp_path / "store")) as again:  # a restarted controller
        assert again.requests_after(RecordCursor("run-1")) == []
