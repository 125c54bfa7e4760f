"""WriteBuffer: bounded memory, spill to disk, replay, nothing lost or doubled."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from lmedge.errors import StoreError, StoreUnavailable
from lmedge.store.buffer import WriteBuffer
from lmedge.store.outcomes import InsertResult


class FlakyServer:
    """An insert callable that stores by `_id` and can be switched off."""

    def __init__(self, fail_after: int | None = None) -> None:
        self.docs: dict[str, dict[str, Any]] = {}
        self.calls: list[tuple[str, int]] = []
        self.up = True
        self.fail_after = fail_after  # go down after this many successful calls

    def __call__(self, collection: str, docs: Sequence[dict[str, Any]]) -> InsertResult:
        if self.fail_after is not None and len(self.calls) >= self.fail_after:
            self.up = False
        if not self.up:
            raise StoreUnavailable("server down")
        if any(d.get("bad") for d in docs):
            raise StoreError("document failed validation")  # refuses the whole batch
        self.calls.append((collection, len(docs)))
        new = 0
        for d in docs:
            if d["_id"] not in self.docs:
                self.docs[d["_id"]] = d
                new += 1
        return InsertResult(inserted=new, duplicates=len(docs) - new)


def batch(start: int, n: int) -> list[dict[str, Any]]:
    return [{"_id": f"d{i:05d}", "i": i} for i in range(start, start + n)]


def make(tmp_path: Path, limit: int = 100) -> WriteBuffer:
    return WriteBuffer(limit=limit, spill_dir=tmp_path / "spill", prefix="test")


def test_flush_sends_batches_oldest_first(tmp_path: Path) -> None:
    buf, server = make(tmp_path), FlakyServer()
    buf.add("requests", batch(0, 10))
    buf.add("runs", batch(10, 1))
    assert buf.stats().pending == 11 and buf.has_backlog()
    assert buf.flush(server) == 11
    assert server.calls == [("requests", 10), ("runs", 1)]
    assert buf.stats().pending == 0 and not buf.has_backlog()


def test_a_failed_flush_keeps_the_batch_and_everything_after_it(tmp_path: Path) -> None:
    buf, server = make(tmp_path), FlakyServer(fail_after=1)
    for k in range(3):
        buf.add("requests", batch(10 * k, 10))
    with pytest.raises(StoreUnavailable):
        buf.flush(server)
    assert buf.stats().pending == 20
    server.fail_after, server.up = None, True
    buf.flush(server)
    assert sorted(server.docs) == [f"d{i:05d}" for i in range(30)]


def test_overflow_spills_the_oldest_and_replays_them_first(tmp_path: Path) -> None:
    buf, server = make(tmp_path, limit=25), FlakyServer()
    when = datetime(2025, 1, 1, 12, 30, 15, 125000, tzinfo=UTC)
    first = [{**d, "at": when, "big": 2**62} for d in batch(0, 10)]
    buf.add("telemetry", first)
    for k in range(1, 5):
        buf.add("requests", batch(10 * k, 10))
    stats = buf.stats()
    assert stats.pending == 20 and stats.spilled == 30  # 3 oldest batches on disk
    assert buf.spill_path.exists()

    assert buf.flush(server) == 50
    assert server.calls[0] == ("telemetry", 10)  # the spill file replays first
    assert server.docs["d00003"]["at"] == when  # dates and int64 survive the file
    assert server.docs["d00003"]["big"] == 2**62
    assert len(server.docs) == 50
    assert buf.stats().replayed == 30 and not buf.spill_path.exists()


def test_an_interrupted_replay_is_resumed_without_duplicates(tmp_path: Path) -> None:
    buf, server = make(tmp_path, limit=1), FlakyServer()
    buf.add("requests", batch(0, 600))  # > the replay batch of 500
    buf.add("requests", batch(600, 600))
    assert buf.stats().pending == 0 and buf.stats().spilled == 1200
    server.fail_after = 1  # the first replayed chunk lands, then the server dies
    with pytest.raises(StoreUnavailable):
        buf.flush(server)
    assert len(server.docs) == 500 and buf.spill_path.exists()
    buf.add("requests", batch(1200, 5))  # new writes while down
    server.fail_after, server.up = None, True
    buf.flush(server)
    assert sorted(server.docs) == [f"d{i:05d}" for i in range(1205)]
    assert not list((tmp_path / "spill").iterdir())


def test_spill_files_of_dead_processes_are_claimed_live_ones_are_not(tmp_path: Path) -> None:
    spill = tmp_path / "spill"
    spill.mkdir()
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    dead_pid = int(dead.stdout)
    other = WriteBuffer(limit=1, spill_dir=spill, prefix="test")
    other.add("requests", batch(0, 3))  # spilled under this (live) pid
    orphan = spill / f"test.{dead_pid}.jsonl"
    other.spill_path.rename(orphan)
    live = spill / f"test.{os.getppid()}.jsonl"  # a running process's file
    live.write_text("")
    unrelated = spill / "another-store.1.jsonl"
    unrelated.write_text("")

    buf, server = make(tmp_path), FlakyServer()
    buf.flush(server)
    assert sorted(server.docs) == ["d00000", "d00001", "d00002"]
    assert not orphan.exists() and live.exists() and unrelated.exists()


def test_without_a_writable_disk_the_overflow_is_dropped_and_counted(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    buf = WriteBuffer(limit=5, spill_dir=blocker / "spill", prefix="test")
    buf.add("requests", batch(0, 4))
    buf.add("requests", batch(4, 4))
    stats = buf.stats()
    assert (stats.pending, stats.spilled, stats.dropped) == (4, 0, 4)


def test_limit_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="at least 1"):
        make(tmp_path, limit=0)


def test_a_refused_batch_loses_only_its_bad_documents(tmp_path: Path) -> None:
    buf, server = make(tmp_path), FlakyServer()
    first = batch(0, 3)
    first[1]["bad"] = True
    buf.add("requests", first)
    buf.add("requests", batch(3, 2))
    assert buf.flush(server) == 4  # no exception: the bad one is isolated
    assert sorted(server.docs) == ["d00000", "d00002", "d00003", "d00004"]
    stats = buf.stats()
    assert (stats.refused, stats.lost, stats.pending) == (1, 1, 0)


def test_an_outage_inside_an_isolated_batch_keeps_the_rest(tmp_path: Path) -> None:
    buf, server = make(tmp_path), FlakyServer()
    docs = batch(0, 4)
    docs[0]["bad"] = True
    buf.add("requests", docs)
    server.fail_after = 1  # d00001 lands one by one, then the server dies
    with pytest.raises(StoreUnavailable):
        buf.flush(server)
    assert sorted(server.docs) == ["d00001"] and buf.stats().pending == 2
    server.fail_after, server.up = None, True
    buf.flush(server)
    assert sorted(server.docs) == ["d00001", "d00002", "d00003"]
    assert buf.stats().refused == 1


def test_a_failed_spill_is_a_counted_loss_not_a_spill(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "read-only"
    blocker.write_text("")  # a file where the spill directory should be
    buf = WriteBuffer(limit=100, spill_dir=blocker / "spill", prefix="test")
    buf.add("requests", batch(0, 7))
    with caplog.at_level("ERROR", logger="lmedge.store.buffer"):
        spilled, lost = buf.spill_all()
    assert (spilled, lost) == (0, 7)
    stats = buf.stats()
    assert (stats.spilled, stats.dropped, stats.lost, stats.pending) == (0, 7, 7, 0)
    assert "7 documents LOST" in caplog.text and "spilled to" not in caplog.text


def test_an_unwritable_spill_directory_is_refused_before_a_run(tmp_path: Path) -> None:
    blocker = tmp_path / "read-only"
    blocker.write_text("")  # a file where the spill directory should be (holds even for root)
    buf = WriteBuffer(limit=100, spill_dir=blocker / "spill", prefix="test")
    with pytest.raises(StoreError, match=r"the spill directory .*/read-only/spill is not writable"):
        buf.check_writable()


def test_a_writable_spill_directory_is_made_and_left_empty(tmp_path: Path) -> None:
    buf = WriteBuffer(limit=100, spill_dir=tmp_path / "a" / "spill", prefix="test")
    buf.check_writable()
    assert list((tmp_path / "a" / "spill").iterdir()) == []


def test_a_torn_spill_line_is_skipped_and_counted(tmp_path: Path) -> None:
    buf, server = make(tmp_path, limit=1), FlakyServer()
    buf.add("requests", batch(0, 3))
    with buf.spill_path.open("a") as out:
        out.write('{"c": "requests", "d": {"_id": "d0')  # a crash mid-line
    assert buf.flush(server) == 3
    assert sorted(server.docs) == ["d00000", "d00001", "d00002"]
    assert buf.stats().dropped == 1 and not buf.spill_path.exists()
