"""Where the gateway's `RequestRecord`s (and its routing windows' decisions) go:
off the event loop, never lost.

The store's writes are synchronous (pymongo) and, while MongoDB is down, each
attempt waits for server selection. A `StoreSink` therefore hands records to a
writer thread through an unbounded queue: `put` never blocks the gateway. The
thread passes them to `Store.record_requests`, whose write buffer keeps them
(in memory, then a spill file) until the server answers, and retries a flush
every `retry_s` while anything waits, so records reach the server after an
outage even when no new request arrives. `close` flushes, or spills to disk.
A routing window's audit `Decision` (request-level routing,
`lmedge.dataplane.windows`) takes the same thread and buffer
(`Store.record_decisions`).
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import Protocol

from lmedge.api.decisions import Decision, RoutingMap
from lmedge.api.records import RequestRecord
from lmedge.errors import StoreUnavailable
from lmedge.store import Store

__all__ = ["MemorySink", "RecordSink", "StoreSink"]

log = logging.getLogger(__name__)

_STOP = object()


class RecordSink(Protocol):
    """Accepts finished records and window decisions; `put` and `put_decision` must not block."""

    def put(self, record: RequestRecord) -> None: ...

    def put_decision(self, decision: Decision[RoutingMap]) -> None: ...

    def close(self) -> None: ...


class MemorySink:
    """Keeps records in a list: for tests and for a gateway run without a store."""

    def __init__(self) -> None:
        self.records: list[RequestRecord] = []
        self.decisions: list[Decision[RoutingMap]] = []

    def put(self, record: RequestRecord) -> None:
        self.records.append(record)

    def put_decision(self, decision: Decision[RoutingMap]) -> None:
        self.decisions.append(decision)

    def close(self) -> None:
        return None


class StoreSink:
    """Writes records to a `Store` from one background thread.

    `batch`: records per `record_requests` call (default 200). `retry_s`: how
    often a backlog is flushed while the server is down, seconds (default 1).
    """

    def __init__(self, store: Store, *, batch: int = 200, retry_s: float = 1.0) -> None:
        self.store = store
        self._batch = batch
        self._retry_s = retry_s
        self._queue: queue.Queue[object] = queue.Queue()
        self.accepted = 0
        self.written = 0
        #: Records the store could not even take (a bug, logged); never silently.
        self.failed = 0
        self._thread = threading.Thread(target=self._loop, name="record-sink", daemon=True)
        self._thread.start()

    def put(self, record: RequestRecord) -> None:
        self.accepted += 1
        self._queue.put(record)

    def put_decision(self, decision: Decision[RoutingMap]) -> None:
        self.accepted += 1
        self._queue.put(decision)

    def pending(self) -> int:
        """Records not yet handed to the store."""
        return self._queue.qsize()

    def close(self) -> None:
        """Write what waits, then close the store (it spills what the server refuses)."""
        self._queue.put(_STOP)
        self._thread.join()
        self.store.close()

    def _loop(self) -> None:
        stopping = False
        while not stopping:
            try:
                first = self._queue.get(timeout=self._retry_s)
            except queue.Empty:
                self._retry_backlog()
                continue
            items = [first]
            while len(items) < self._batch:
                try:
                    items.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            stopping = any(item is _STOP for item in items)
            records = [item for item in items if isinstance(item, RequestRecord)]
            decisions = [item for item in items if isinstance(item, Decision)]
            if decisions:
                try:
                    self.store.record_decisions(decisions)
                except Exception:
                    self.failed += len(decisions)
                    log.exception(
                        "record sink: %d decisions not handed to the store", len(decisions)
                    )
                else:
                    self.written += len(decisions)
            if records:
                # Never raises for an outage: the store buffers and retries later.
                try:
                    self.store.record_requests(records, feed=True)  # the controller reads them
                except Exception:  # this thread must outlive any one bad batch
                    self.failed += len(records)
                    log.exception("record sink: %d records not handed to the store", len(records))
                else:
                    self.written += len(records)

    def _retry_backlog(self) -> None:
        if not self.store.has_backlog():
            return
        try:
            self.store.flush()
        except StoreUnavailable as exc:
            log.debug("record sink: store still unavailable: %s", exc)
        except Exception:
            log.exception("record sink: flushing the store failed")
