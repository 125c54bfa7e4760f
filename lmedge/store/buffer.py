"""Writes the server has not acknowledged yet, kept until it has.

The control loop must not stop, and must not lose request records, when the
MongoDB server is briefly unreachable. Every write therefore goes through a
`WriteBuffer`: a queue of batches, flushed oldest first.

Bound and overflow: at most `limit` documents wait in memory. Beyond that the
oldest batches are appended to a spill file (one JSON line per document, in
MongoDB extended JSON so dates and 64-bit integers survive) and replayed before
the in-memory batches on the next flush. Nothing is dropped; the only loss is
a spill file that cannot be written (disk full), which is logged and counted in
`dropped`. A replay after a partial write is harmless because every document
carries its `_id` from the start and the backends treat a duplicate `_id` as
"already stored".

Spill files are named `<prefix>.<pid>.jsonl` in the spill directory. A flush
replays this process's files and those of processes that are no longer alive
(claimed by an atomic rename, so two processes never replay the same file).
"""

from __future__ import annotations

import logging
import os
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bson import json_util

from lmedge.errors import StoreUnavailable

__all__ = ["BufferStats", "WriteBuffer"]

log = logging.getLogger(__name__)

Doc = dict[str, Any]
Insert = Callable[[str, Sequence[Doc]], int]

#: Documents per insert when replaying a spill file.
_REPLAY_BATCH = 500
_JSON = json_util.JSONOptions(json_mode=json_util.JSONMode.RELAXED, tz_aware=True)


@dataclass(frozen=True)
class BufferStats:
    """Counters of a `WriteBuffer`; all counts are documents."""

    #: Waiting in memory.
    pending: int
    #: Written to spill files over the buffer's lifetime.
    spilled: int
    #: Re-inserted from spill files.
    replayed: int
    #: Lost: a spill file could not be written, or the server refused them for good.
    dropped: int


@dataclass
class _Batch:
    collection: str
    docs: list[Doc]


class WriteBuffer:
    """A bounded queue of unacknowledged batches with a replayed spill file.

    `add` never blocks on the server; `flush(insert)` sends batches oldest first
    (spill files, then memory) and stops at the first `StoreUnavailable`, keeping
    that batch and everything after it. Thread-safe: one flush at a time, and
    `add` may run concurrently with a flush (the batch in flight is outside the
    bound for that moment). A batch the server refuses for good (any error but
    `StoreUnavailable`) is dropped, counted and re-raised, so it cannot block
    the batches behind it.
    """

    def __init__(self, *, limit: int, spill_dir: Path, prefix: str) -> None:
        if limit < 1:
            raise ValueError("buffer limit must be at least 1 document")
        self.limit = limit
        self.spill_dir = spill_dir
        self._prefix = prefix
        self._batches: deque[_Batch] = deque()
        self._pending = 0
        self._spilled = 0
        self._replayed = 0
        self._dropped = 0
        self._claims = 0
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()

    @property
    def spill_path(self) -> Path:
        """This process's spill file (exists only after an overflow)."""
        return self.spill_dir / f"{self._prefix}.{os.getpid()}.jsonl"

    def stats(self) -> BufferStats:
        with self._lock:
            return BufferStats(self._pending, self._spilled, self._replayed, self._dropped)

    def add(self, collection: str, docs: Sequence[Doc]) -> None:
        """Queue documents for `collection`; spill the oldest if over the bound."""
        if not docs:
            return
        with self._lock:
            self._batches.append(_Batch(collection, list(docs)))
            self._pending += len(docs)
            self._enforce_bound()

    def has_backlog(self) -> bool:
        """True when anything waits in memory or in a spill file."""
        with self._lock:
            if self._pending:
                return True
        return any(self._replayable())

    def flush(self, insert: Insert) -> int:
        """Send everything that waits; return the number of documents sent.

        Raises `StoreUnavailable` (after requeueing) when the server stops answering.
        """
        sent = 0
        with self._flush_lock:
            for path in self._replayable():
                sent += self._replay(path, insert)
            while True:
                with self._lock:
                    if not self._batches:
                        return sent
                    batch = self._batches.popleft()
                    self._pending -= len(batch.docs)
                try:
                    insert(batch.collection, batch.docs)
                except StoreUnavailable:
                    with self._lock:
                        self._batches.appendleft(batch)
                        self._pending += len(batch.docs)
                        self._enforce_bound()
                    raise
                except Exception:
                    # Refused for good (e.g. a validator): retrying would wedge
                    # every later write behind this batch, so it is dropped.
                    with self._lock:
                        self._dropped += len(batch.docs)
                    log.error(
                        "store buffer: %d documents for %s refused and dropped",
                        len(batch.docs),
                        batch.collection,
                    )
                    raise
                sent += len(batch.docs)

    def spill_all(self) -> None:
        """Move every in-memory batch to the spill file (at close, server down)."""
        with self._lock:
            self._spill_while(lambda: bool(self._batches))

    # -- internals (callers hold the locks noted) ---------------------------------

    def _enforce_bound(self) -> None:  # holds _lock
        self._spill_while(lambda: self._pending > self.limit and bool(self._batches))

    def _spill_while(self, more: Callable[[], bool]) -> None:  # holds _lock
        if not more():
            return
        try:
            self.spill_dir.mkdir(parents=True, exist_ok=True)
            with self.spill_path.open("a", encoding="utf-8") as out:
                while more():
                    batch = self._batches.popleft()
                    self._pending -= len(batch.docs)
                    out.writelines(
                        json_util.dumps({"c": batch.collection, "d": doc}, json_options=_JSON)
                        + "\n"
                        for doc in batch.docs
                    )
                    self._spilled += len(batch.docs)
        except OSError as exc:
            # Memory is bounded by promise; with no disk either, the oldest go.
            while more():
                batch = self._batches.popleft()
                self._pending -= len(batch.docs)
                self._dropped += len(batch.docs)
            log.error(
                "store buffer: cannot spill to %s (%s); %d documents dropped so far",
                self.spill_path,
                exc,
                self._dropped,
            )

    def _replayable(self) -> Iterator[Path]:
        """Spill files this process may replay: its own, and dead processes'."""
        if not self.spill_dir.is_dir():
            return
        for path in sorted(self.spill_dir.glob(f"{self._prefix}.*.jsonl")):
            parts = path.name[len(self._prefix) + 1 :].split(".")
            try:
                pid = int(parts[0])
            except ValueError:
                continue
            if pid == os.getpid() or not _alive(pid):
                yield path

    def _replay(self, path: Path, insert: Insert) -> int:  # holds _flush_lock
        # Claim the file: new overflow goes to a fresh spill file meanwhile, and no
        # other process can pick this one up once renamed.
        with self._lock:
            self._claims += 1
            claimed = path.with_name(f"{self._prefix}.{os.getpid()}.replay{self._claims}.jsonl")
            try:
                path.rename(claimed)
            except FileNotFoundError:
                return 0  # another process claimed it first
        sent = 0
        group: dict[str, list[Doc]] = {}
        with claimed.open(encoding="utf-8") as lines:
            for line in lines:
                if not line.strip():
                    continue
                item = json_util.loads(line, json_options=_JSON)
                docs = group.setdefault(item["c"], [])
                docs.append(item["d"])
                if len(docs) >= _REPLAY_BATCH:
                    sent += self._send(claimed, item["c"], docs, insert)
                    docs.clear()
            for collection, docs in group.items():
                sent += self._send(claimed, collection, docs, insert)
        claimed.unlink()
        with self._lock:
            self._replayed += sent
        return sent

    def _send(self, claimed: Path, collection: str, docs: list[Doc], insert: Insert) -> int:
        if not docs:
            return 0
        try:
            insert(collection, docs)
        except StoreUnavailable:
            # Keep the whole file under this process's name; it replays again later
            # (documents already inserted are then recognised by their `_id`).
            claimed.rename(claimed.with_name(f"{self._prefix}.{os.getpid()}.jsonl.tmp"))
            self._merge_back(claimed.with_name(f"{self._prefix}.{os.getpid()}.jsonl.tmp"))
            raise
        return len(docs)

    def _merge_back(self, tmp: Path) -> None:
        """Prepend an unfinished replay to this process's spill file."""
        with self._lock:
            own = self.spill_path
            if own.exists():
                with tmp.open("a", encoding="utf-8") as out, own.open(encoding="utf-8") as rest:
                    for line in rest:
                        out.write(line)
            tmp.replace(own)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True
