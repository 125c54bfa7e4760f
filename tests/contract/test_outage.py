"""No request record is lost, or stored twice, when the server dies mid-write.

A writer thread records batches while FerretDB is SIGKILLed, stays down until
the in-memory bound has overflowed into the spill file,
and is restarted on the same port and data directory. After one `flush()`
every record must be stored exactly once, from memory and from the spill file.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from lmedge.store import StoreOptions, open_store
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
