"""Writes the server has not acknowledged yet, kept until it has.

The control loop must not stop, and must not lose request records, when the
MongoDB server is briefly unreachable. Every write therefore goes through a
`WriteBuffer`: a queue of batches, flushed oldest first.

Bound and overflow: at most `limit` documents wait in memory. Beyond that the
oldest batches are appended to a spill file (one JSON line per document, in
MongoDB extended JSON so dates and 64-bit integers survive) and replayed before
the in-memory batches on the next flush. A replay after a partial write is
harmless because every document carries its `_id` from the start and the
backends take a duplicate `_id` with the same content as "already stored".

What can be lost, each counted and logged as an error, never silently:

* `dropped`: a spill file that cannot be written (read-only or full disk) or
  a line of one that cannot be read back;
* `refused`: documents the store refuses for good (a validator, a document
  that cannot be encoded). A batch refused as a whole is retried one document
  at a time, so only the bad documents are lost, never their neighbours;
* `conflicts`: documents whose `_id` is already stored with other content.

Spill files are named `<prefix>.<pid>.jsonl` in the spill directory; the
prefix names the server *and* database, so a file is only ever replayed into
the store it was written for. A flush replays this process's files and those
of processes that are no longer alive (claimed by an atomic rename, so two
processes never replay the same file).
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

from lmedge.errors import StoreError, StoreUnavailable
from lmedge.store.outcomes import InsertResult, Rejected

__all__ = ["BufferStats", "WriteBuffer"]

log = logging.getLogger(__name__)

Doc = dict[str, Any]
Insert = Callable[[str, Sequence[Doc]], InsertResult]

#: Documents per insert when replaying a spill file.
_REPLAY_BATCH = 500
#: Rejected documents named in one log line (the count is always complete).
_LOGGED_IDS = 3
_JSON = json_util.JSONOptions(json_mode=json_util.JSONMode.RELAXED, tz_aware=True)


@dataclass(frozen=True)
class BufferStats:
    """Counters of a `WriteBuffer`; all counts are documents."""

    #: Waiting in memory.
    pending: int
    #: Written to spill files over the buffer's lifetime.
    spilled: int
    #: Read back from spill files and sent again.
    replayed: int
    #: Lost: a spill file could not be written, or one of its lines not read back.
    dropped: int = 0
    #: Lost: refused for good by the store (validator, cannot be encoded).
    refused: int = 0
    #: Lost: their `_id` is stored with other content.
    conflicts: int = 0

    @property
    def lost(self) -> int:
        """Documents that will never reach the store, for whatever reason."""
        return self.dropped + self.refused + self.conflicts


@dataclass
class _Batch:
    collection: str
    docs: list[Doc]


class _Interrupted(Exception):
    """The server stopped answering inside a batch; `remaining` were not sent."""

    def __init__(self, remaining: list[Doc], cause: StoreUnavailable) -> None:
        super().__init__(str(cause))
        self.remaining = remaining
        self.cause = cause


class WriteBuffer:
    """A bounded queue of unacknowledged batches with a replayed spill file.

    `add` never blocks on the server; `flush(insert)` sends batches oldest first
    (spill files, then memory) and stops at the first `StoreUnavailable`, keeping
    that batch and everything after it. Thread-safe: one flush at a time, and
    `add` may run concurrently with a flush (the batch in flight is outside the
    bound for that moment). A batch the store refuses as a whole (any error
    but `StoreUnavailable`) is retried document by document; what is refused
    for good is counted in `refused` and logged, and never blocks the batches
    behind it. Only `StoreUnavailable` leaves `flush`.
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
        self._refused = 0
        self._conflicts = 0
        self._claims = 0
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()

    @property
    def spill_path(self) -> Path:
        """This process's spill file (exists only after an overflow)."""
        return self.spill_dir / f"{self._prefix}.{os.getpid()}.jsonl"

    def stats(self) -> BufferStats:
        with self._lock:
            return BufferStats(
                self._pending,
                self._spilled,
                self._replayed,
                self._dropped,
                self._refused,
                self._conflicts,
            )

    def pending(self) -> int:
        """Documents waiting in memory."""
        with self._lock:
            return self._pending

    def add(self, collection: str, docs: Sequence[Doc]) -> None:
        """Queue documents for `collection`; spill the oldest if over the bound."""
        if not docs:
            return
        with self._lock:
            self._batches.append(_Batch(collection, list(docs)))
            self._pending += len(docs)
            self._enforce_bound()

    def check_writable(self) -> None:
        """Raise `StoreError` unless a spill file can be written in `spill_dir`.

        Checked when a run starts (the controller, `lmedge simulate` with a
        store): a spill that fails later loses the records of an outage with
        only a log line, so a run that could not keep them does not start.
        """
        probe = self.spill_dir / f".write-check.{os.getpid()}"
        try:
            self.spill_dir.mkdir(parents=True, exist_ok=True)
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            raise StoreError(
                f"the spill directory {self.spill_dir} is not writable "
                f"({exc.strerror or exc}): records the store cannot take while it is "
                "down would be lost; run where it can be created and written"
            ) from exc

    def has_backlog(self) -> bool:
        """True when anything waits in memory or in a spill file."""
        with self._lock:
            if self._pending:
                return True
        return any(self._replayable())

    def flush(self, insert: Insert) -> int:
        """Send everything that waits; return the documents now in the store.

        Raises `StoreUnavailable` (after requeueing what was not sent) when the
        server stops answering; nothing else.
        """
        sent = 0
        with self._flush_lock:
            try:
                for path in self._replayable():
                    sent += self._replay(path, insert)
            except _Interrupted as stop:
                raise stop.cause from None
            while True:
                with self._lock:
                    if not self._batches:
                        return sent
                    batch = self._batches.popleft()
                    self._pending -= len(batch.docs)
                try:
                    sent += self._send_batch(batch.collection, batch.docs, insert)
                except _Interrupted as stop:
                    with self._lock:
                        self._batches.appendleft(_Batch(batch.collection, stop.remaining))
                        self._pending += len(stop.remaining)
                        self._enforce_bound()
                    raise stop.cause from None

    def spill_all(self) -> tuple[int, int]:
        """Move every in-memory batch to the spill file (at close, server down).

        Returns (documents spilled, documents lost because the file could not
        be written).
        """
        with self._lock:
            spilled, dropped = self._spilled, self._dropped
            self._spill_while(lambda: bool(self._batches))
            return self._spilled - spilled, self._dropped - dropped

    def _send_batch(self, collection: str, docs: list[Doc], insert: Insert) -> int:
        """Insert `docs`, isolating what the store refuses; documents now stored.

        Raises `_Interrupted` with the documents not yet sent when the server
        stops answering.
        """
        try:
            result = insert(collection, docs)
        except StoreUnavailable as exc:
            raise _Interrupted(docs, exc) from exc
        except Exception as exc:  # refused as a whole: find the bad documents
            if len(docs) == 1:
                reason = f"{type(exc).__name__}: {exc}"
                self.account(collection, InsertResult(rejected=(Rejected(_id(docs[0]), reason),)))
                return 0
            stored = 0
            for i, doc in enumerate(docs):
                try:
                    stored += self._send_batch(collection, [doc], insert)
                except _Interrupted as stop:
                    raise _Interrupted(docs[i:], stop.cause) from None
            return stored
        self.account(collection, result)
        return result.inserted + result.duplicates

    def account(self, collection: str, result: InsertResult) -> None:
        """Count and log what a batch insert did not store."""
        if not result.rejected:
            return
        conflicts = [r for r in result.rejected if r.conflict]
        refused = [r for r in result.rejected if not r.conflict]
        with self._lock:
            self._conflicts += len(conflicts)
            self._refused += len(refused)
        for kind, items in (("conflict with a stored document", conflicts), ("refused", refused)):
            if items:
                shown = "; ".join(f"{r.id!r}: {r.reason}" for r in items[:_LOGGED_IDS])
                more = f" (and {len(items) - _LOGGED_IDS} more)" if len(items) > _LOGGED_IDS else ""
                log.error(
                    "store: %d documents for %s not stored (%s): %s%s",
                    len(items),
                    collection,
                    kind,
                    shown,
                    more,
                )

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
                    batch = self._batches[0]
                    # One write per batch, so a failure loses whole batches (counted
                    # below) rather than leaving a batch half in the file.
                    out.write(
                        "".join(
                            json_util.dumps({"c": batch.collection, "d": doc}, json_options=_JSON)
                            + "\n"
                            for doc in batch.docs
                        )
                    )
                    out.flush()
                    self._batches.popleft()
                    self._pending -= len(batch.docs)
                    self._spilled += len(batch.docs)
        except (OSError, TypeError, ValueError) as exc:
            # Memory is bounded by promise; with no disk either, the oldest go.
            lost = 0
            while more():
                batch = self._batches.popleft()
                self._pending -= len(batch.docs)
                lost += len(batch.docs)
            self._dropped += lost
            log.error(
                "store buffer: cannot spill to %s (%s): %d documents LOST (%d lost so far)",
                self.spill_path,
                exc,
                lost,
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
        unreadable = 0
        group: dict[str, list[Doc]] = {}
        with claimed.open(encoding="utf-8", errors="replace") as lines:
            for number, line in enumerate(lines, 1):
                if not line.strip():
                    continue
                try:
                    item = json_util.loads(line, json_options=_JSON)
                    collection, doc = str(item["c"]), dict(item["d"])
                except (ValueError, KeyError, TypeError) as exc:
                    # A line torn by a crash mid-write (or edited): lost, and said so.
                    unreadable += 1
                    log.error(
                        "store buffer: line %d of %s unreadable (%s); lost", number, path, exc
                    )
                    continue
                docs = group.setdefault(collection, [])
                docs.append(doc)
                if len(docs) >= _REPLAY_BATCH:
                    sent += self._send(claimed, collection, docs, insert)
                    docs.clear()
            for collection, docs in group.items():
                sent += self._send(claimed, collection, docs, insert)
        claimed.unlink()
        with self._lock:
            self._replayed += sent
            self._dropped += unreadable
        return sent

    def _send(self, claimed: Path, collection: str, docs: list[Doc], insert: Insert) -> int:
        if not docs:
            return 0
        try:
            return self._send_batch(collection, list(docs), insert)
        except _Interrupted as stop:
            # Keep the whole file under this process's name; it replays again later
            # (documents already inserted are then recognised by their `_id`).
            tmp = claimed.with_name(f"{self._prefix}.{os.getpid()}.jsonl.tmp")
            claimed.rename(tmp)
            self._merge_back(tmp)
            raise _Interrupted([], stop.cause) from None

    def _merge_back(self, tmp: Path) -> None:
        """Prepend an unfinished replay to this process's spill file."""
        with self._lock:
            own = self.spill_path
            if own.exists():
                with tmp.open("a", encoding="utf-8") as out, own.open(encoding="utf-8") as rest:
                    for line in rest:
                        out.write(line)
            tmp.replace(own)


def _id(doc: Doc) -> Any:
    return doc.get("_id")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True
