"""No request record is lost, or stored twice, when the server dies mid-write.

A writer thread records batches while FerretDB is SIGKILLed, stays down until
the in-memory bound has overflowed into the spill file,
and is restarted on the same port and data directory. After one `flush()`
every record must be stored exactly once, from memory and from the spill file.
"""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path

import pytest

from lmedge.errors import StoreUnavailable
from lmedge.store import RecordCursor, StoreOptions, open_store
from tests.fixtures.ferretdb import FerretDBServer

from . import samples

BATCHES = 60
BATCH = 250


@pytest.mark.ferretdb
@pytest.mark.slow
def test_sigkill_mid_write_loses_and_duplicates_nothing(
    ferretdb: FerretDBServer, tmp_path: Path
) -> None:
    spill = tmp_path / "spill"
    options = StoreOptions(
        buffer_limit=2_000, spill_dir=spill, batch_size=BATCH, retry_interval_s=0.2
    )
    records = samples.requests("outage", BATCHES * BATCH)
    written = threading.Event()
    progress = {"batches": 0}
    errors: list[BaseException] = []

    with open_store(ferretdb.uri(), options=options) as store:
        store.record_run(samples.run_info("outage"))

        def writer() -> None:
            try:
                for i in range(BATCHES):
                    store.record_requests(records[i * BATCH : (i + 1) * BATCH])
                    progress["batches"] = i + 1
                    if i == 10:
                        written.set()
                    time.sleep(0.02)
            except BaseException as exc:  # surfaced by the main thread
                errors.append(exc)
                written.set()

        thread = threading.Thread(target=writer, name="request-writer")
        thread.start()
        assert written.wait(30)
        ferretdb.kill()  # the writer is between or inside inserts
        killed_at = progress["batches"]
        # Stay down until the writer has overflowed the in-memory bound to disk.
        deadline = time.monotonic() + 60
        while store.buffer_stats().spilled == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        mid_outage = store.buffer_stats()
        ferretdb.start()
        thread.join(60)
        assert not thread.is_alive() and errors == []

        store.flush()
        stats = store.buffer_stats()
        ids = [r.id for r in store.requests("outage")]

    assert killed_at < BATCHES, "the kill must land while the writer is still writing"
    assert mid_outage.spilled > 0, "the outage must overflow the bound into the spill file"
    assert stats.replayed == stats.spilled
    assert stats.pending == 0 and stats.dropped == 0
    assert not list(spill.glob("*.jsonl")), "replayed spill files are removed"
    assert len(ids) == len(set(ids)) == len(records)
    assert ids == [r.id for r in records]


@pytest.mark.ferretdb
@pytest.mark.slow
def test_background_flush_and_the_feed_lose_nothing_across_an_outage(
    ferretdb: FerretDBServer, tmp_path: Path
) -> None:
    """The controller's path: writes sent by the background thread, records read
    from the feed. FerretDB is SIGKILLed mid-run and stays down until the
    in-memory bound has spilled; after the restart every record is stored
    once and read through the feed exactly once."""
    spill = tmp_path / "spill"
    options = StoreOptions(
        buffer_limit=1_000,
        spill_dir=spill,
        batch_size=BATCH,
        retry_interval_s=0.2,
        background_flush=True,
    )
    records = samples.requests("feed", BATCHES * BATCH)
    cursor = RecordCursor("feed")
    read: list[str] = []

    def read_feed() -> None:
        # While the server is away the controller skips a slot; the records wait.
        with contextlib.suppress(StoreUnavailable):
            read.extend(r.id for r in store.requests_after(cursor))

    with open_store(ferretdb.uri(), options=options) as store:
        store.record_run(samples.run_info("feed"))
        half = BATCHES // 2
        for i in range(half):
            store.record_requests(records[i * BATCH : (i + 1) * BATCH], feed=True)
            if i % 5 == 4:
                read_feed()
        ferretdb.kill()
        for i in range(half, BATCHES):  # never blocks: buffered, then spilled
            store.record_requests(records[i * BATCH : (i + 1) * BATCH], feed=True)
            if i % 5 == 4:
                read_feed()  # each read waits for server selection (1 s)
        mid_outage = store.buffer_stats()
        ferretdb.start()
        deadline = time.monotonic() + 120
        while store.has_backlog() and time.monotonic() < deadline:
            time.sleep(0.1)  # the background thread replays on its own
        assert not store.has_backlog(), "the background flush sends what waited"
        read_feed()
        read_feed()
        stats = store.buffer_stats()
        stored = [r.id for r in store.requests("feed")]

    assert mid_outage.spilled > 0, "the outage must overflow the bound into the spill file"
    assert stats.pending == 0 and stats.lost == 0
    assert not list(spill.glob("*.jsonl")), "replayed spill files are removed"
    assert len(stored) == len(set(stored)) == len(records)
    assert sorted(read) == sorted(r.id for r in records), "each record read exactly once"
