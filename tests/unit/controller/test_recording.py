"""`StoreWriter`: what the loop hands to the store each slot."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from lmedge.api import RequestRecord
from lmedge.controller.recording import StoreWriter
from lmedge.store import StoreOptions, open_store


def _record(i: int) -> RequestRecord:
    return RequestRecord(id=f"r{i}", run="run-1", lm="lm1", origin="w1", destination="w1",
                         prompts=1, slot=0, submit_s=float(i), outcome="success")  # fmt: skip


@pytest.mark.parametrize(
    ("store_records", "stored"), [(True, ["r0", "r1"]), (False, [])], ids=["emulator", "cluster"]
)
def test_records_read_from_the_store_are_not_stored_again(
    tmp_path: Path, store_records: bool, stored: list[str]
) -> None:
    with open_store(str(tmp_path / "store")) as store:
        writer = StoreWriter(store, "run-1", None, records=store_records)
        writer.record(0, [_record(0), _record(1)], [])
        store.flush()
        assert sorted(d["id"] for d in store._backend.find("requests", {})) == stored


def test_background_flush_sends_without_being_asked(tmp_path: Path) -> None:
    options = StoreOptions(spill_dir=tmp_path / "spill", background_flush=True)
    with open_store(str(tmp_path / "store"), options=options) as store:
        store.record_requests([_record(i) for i in range(50)])
        deadline = time.monotonic() + 60  # generous: a loaded machine
        while store._backend.count("requests", {}) < 50 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert store._backend.count("requests", {}) == 50, "no flush() was called"
        assert not store.has_backlog()
        assert store.buffer_stats().lost == 0


def test_records_are_sent_once_enough_wait_whatever_store_every_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("lmedge.controller.recording.MAX_UNSENT_RECORDS", 10)
    with open_store(str(tmp_path / "store")) as store:
        writer = StoreWriter(store, "run-1", None, store_every=1_000)
        writer.record(0, [_record(i) for i in range(6)], [])
        assert store._backend.count("requests", {}) == 0  # held for store_every
        writer.record(1, [_record(i) for i in range(6, 12)], [])
        assert store._backend.count("requests", {}) == 12  # 12 >= 10 waited: sent


def test_a_write_beyond_the_buffer_bound_is_sent_not_spilled_while_the_store_answers(
    tmp_path: Path,
) -> None:
    options = StoreOptions(spill_dir=tmp_path / "spill", buffer_limit=20, batch_size=5)
    with open_store(str(tmp_path / "store"), options=options) as store:
        store.record_requests([_record(i) for i in range(100)])
        assert store.buffer_stats().spilled == 0
        assert store._backend.count("requests", {}) == 100
        assert not (tmp_path / "spill").exists() or not any((tmp_path / "spill").iterdir())
