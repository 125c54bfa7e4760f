"""`Store`: the one repository of decisions, requests, telemetry, memory and runs.

Callers hand it pydantic models and get pydantic models back; they never see a
driver, a cursor or a BSON type, and the same code runs on MongoDB and on the
embedded backend. Writes are buffered (see `lmedge.store.buffer`): a `record_*`
call never raises, whatever happens to the server: it keeps the documents and
sends them with a later write or `flush()`, or from a background thread
(`StoreOptions.background_flush`). A document that cannot be stored
at all (it cannot be encoded, it is larger than a BSON document may be, the
server refuses it, or its `_id` is taken by a different record) is isolated,
counted in `buffer_stats()` and logged as an error; the rest of its batch is
stored. Reads go to the server and raise `StoreUnavailable` when it does not
answer; a stored document that does not validate as its model is logged and
skipped, so one bad document never fails every read of its collection.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, cast

import bson
import bson.errors
from pydantic import BaseModel, TypeAdapter, ValidationError

from lmedge.api.decisions import WINDOW_TRIGGER, AgentKind
from lmedge.api.observations import LMStats, MemoryCase
from lmedge.api.records import NodeTelemetry, RequestRecord
from lmedge.api.totals import RunTotals
from lmedge.errors import StoreError, StoreUnavailable
from lmedge.store.backends import Backend
from lmedge.store.buffer import BufferStats, WriteBuffer
from lmedge.store.documents import (
    COLLECTIONS,
    DECISION_COLLECTIONS,
    DECISION_MODELS,
    FEED,
    AnyDecision,
    RunInfo,
    feed_documents,
    feed_records,
    from_document,
    to_document,
)
from lmedge.store.outcomes import InsertResult, Rejected

__all__ = ["Store", "StoreOptions", "StoreStatus"]

log = logging.getLogger(__name__)

#: The largest document a MongoDB server accepts (BSON's 16 MiB limit).
MAX_DOCUMENT_BYTES: Final = 16 * 1024 * 1024


@dataclass(frozen=True)
class StoreOptions:
    """Tuning of a `Store`; the defaults suit both the emulator and a cluster."""

    #: Documents held in memory while the server is unreachable before the
    #: oldest spill to disk. 100,000 request records are about 60 MB.
    buffer_limit: int = 100_000
    #: Where overflow is spilled; default `./.lmedge/spill`.
    spill_dir: Path = Path(".lmedge/spill")
    #: Documents per insert; MontyDB commits one SQLite transaction per batch.
    #: Also the most records one request feed document carries.
    batch_size: int = 500
    #: After a failed flush, automatic flushes (on `record_*`) wait this long so
    #: that each write does not pay the server-selection timeout again. Seconds.
    retry_interval_s: float = 2.0
    #: Telemetry is deleted this long after it is stored, where the server has
    #: TTL indexes. Seconds; default 7 days.
    telemetry_ttl_s: int = 7 * 24 * 3600
    #: How long `drain()` (and so `close()`) keeps retrying a server that does
    #: not answer before it leaves what waits in the spill file. Seconds;
    #: default 15: a brief outage (a MongoDB pod restart) is waited out, and a
    #: component stopped with the default 30 s termination grace period still
    #: has time to spill before it is killed.
    drain_s: float = 15.0
    #: Send writes from a background thread: a `record_*` call then only
    #: encodes and queues (the bounded buffer, which spills when full), so a
    #: caller on a latency path (the controller's slot) never waits for the
    #: server. Off: each `record_*` flushes in the caller's thread.
    background_flush: bool = False


@dataclass
class RecordCursor:
    """The reader of one run's request feed (`Store.requests_after`).

    `unconfirmed` holds the `_id`s of the feed documents (batches of records)
    returned whose removal from the feed the server has not confirmed yet (it
    is under way in the background, or the server went away before it): they
    may still be in the feed and must not be returned again. An id leaves it
    once its removal succeeds or a read no longer finds it, so it never holds
    more than the feed did. The store guards it (its reads and the background
    removal share it): read it only between `requests_after` calls.
    """

    run: str
    unconfirmed: set[str] = field(default_factory=set)


@dataclass(frozen=True)
class StoreStatus:
    """A summary for `lmedge store status` and the operator's health check."""

    backend: str
    where: str
    counts: dict[str, int]
    latest_run: RunInfo | None
    validators: bool
    ttl: bool
    buffer: BufferStats


class Store:
    """Repository over one backend. Build it with `lmedge.store.open_store`."""

    def __init__(self, backend: Backend, options: StoreOptions | None = None) -> None:
        self.options = options or StoreOptions()
        self._backend = backend
        # Keyed by server *and* database: a spill file is replayed only into its own store.
        prefix = hashlib.sha1(backend.identity.encode()).hexdigest()[:12]
        self._buffer = WriteBuffer(
            limit=self.options.buffer_limit, spill_dir=self.options.spill_dir, prefix=prefix
        )
        self._retry_at = 0.0
        #: Feed documents returned by `requests_after`, to delete (`background_flush`).
        self._removals: list[tuple[RecordCursor, list[str]]] = []
        self._state = threading.Lock()
        self._wake = threading.Event()
        self._stopping = False
        self._flusher: threading.Thread | None = None
        if self.options.background_flush:
            self._flusher = threading.Thread(
                target=self._flush_in_background, name="store-flush", daemon=True
            )
            self._flusher.start()

    @property
    def backend(self) -> str:
        """`mongodb` or `embedded`."""
        return self._backend.kind

    @property
    def where(self) -> str:
        """Where the data lives, for messages."""
        return self._backend.where

    def ensure_schema(self) -> None:
        """Create collections and indexes; validators and TTL where supported."""
        self._backend.ensure(list(COLLECTIONS.values()), self.options.telemetry_ttl_s)

    # -- writes ---------------------------------------------------------------

    def record_run(self, run: RunInfo) -> None:
        """Register a run (idempotent: the first registration of an id wins)."""
        self._write("runs", [to_document(run)])

    def record_totals(self, totals: RunTotals) -> None:
        """Store a run's totals (idempotent: the first for a run wins)."""
        self._write("run_totals", [to_document(totals)])

    def record_decision(self, decision: AnyDecision) -> None:
        """Store one decision in its agent's collection."""
        self._write(DECISION_COLLECTIONS[decision.agent], [to_document(decision)])

    def record_decisions(self, decisions: Iterable[AnyDecision]) -> None:
        """Store many decisions: one batch per agent's collection."""
        by_collection: dict[str, list[dict[str, Any]]] = {}
        for d in decisions:
            by_collection.setdefault(DECISION_COLLECTIONS[d.agent], []).append(to_document(d))
        for collection, docs in by_collection.items():
            self._write(collection, docs)

    def record_requests(self, records: Iterable[RequestRecord], *, feed: bool = False) -> None:
        """Store request records (idempotent by `RequestRecord.id`).

        `feed`: also queue them for the controller's incremental read
        (`requests_after`), in batches of `StoreOptions.batch_size`; the
        gateways' records, not the controller's own copy of what it read.
        """
        docs = self._encodable("requests", [to_document(r) for r in records])
        self._queue("requests", docs)
        if feed:
            self._queue(FEED, feed_documents(docs, self.options.batch_size))
        self._sent()

    def record_telemetry(self, snapshots: Iterable[NodeTelemetry]) -> None:
        """Store node telemetry snapshots (expiring where the server has TTL)."""
        self._write("telemetry", [to_document(s) for s in snapshots])

    def record_memory(self, case: MemoryCase) -> None:
        """Store one episodic memory case (idempotent by run and epoch)."""
        self._write("memory", [to_document(case)])

    def flush(self) -> None:
        """Send everything buffered now; raise `StoreUnavailable` if the server is down.

        Then feed documents read and waiting for their removal are deleted (a
        failed removal is left to the next read: it never raises for it).
        """
        try:
            self._buffer.flush(self._backend.insert)
        except StoreUnavailable:
            with self._state:
                self._retry_at = time.monotonic() + self.options.retry_interval_s
            raise
        with self._state:
            self._retry_at = 0.0
        self._remove_read()

    def check_spill_dir(self) -> None:
        """Raise `StoreError` unless this store can spill what its server does not take.

        A run (the controller, `lmedge simulate`) checks this before it starts;
        see `WriteBuffer.check_writable`.
        """
        self._buffer.check_writable()

    def buffer_stats(self) -> BufferStats:
        """Counters of documents waiting, spilled, replayed and lost."""
        return self._buffer.stats()

    def has_backlog(self) -> bool:
        """True while documents wait in memory or in this store's spill files."""
        return self._buffer.has_backlog()

    @property
    def spill_path(self) -> Path:
        """Where this process spills documents the server has not taken."""
        return self._buffer.spill_path

    def drain(self, timeout_s: float | None = None) -> bool:
        """Flush, retrying a server that does not answer for up to `timeout_s`.

        Default `StoreOptions.drain_s`. True when nothing waits any more; False
        when the server stayed away (what waits is still buffered). Never raises.
        """
        wait = self.options.drain_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + wait
        while True:
            try:
                self.flush()
                return True
            except StoreUnavailable as exc:
                left = deadline - time.monotonic()
                if left <= 0:
                    log.warning("store: %s; gave up waiting after %.0f s", exc, wait)
                    return False
                time.sleep(min(self.options.retry_interval_s, left))

    def close(self) -> None:
        """Drain; if the server stays down, spill what waits to disk. Then disconnect.

        Logs, as errors, every document that will never be stored.
        """
        if self._flusher is not None:
            self._stopping = True
            self._wake.set()
            self._flusher.join()
            self._flusher = None
        try:
            if not self.drain():
                spilled, _ = self._buffer.spill_all()  # a loss is logged by the buffer
                if spilled:
                    log.warning(
                        "store closed while %s does not answer: %d documents spilled to %s; "
                        "the next write to this store replays them",
                        self.where,
                        spilled,
                        self._buffer.spill_path,
                    )
        finally:
            self._backend.close()
        stats = self._buffer.stats()
        if stats.lost:
            log.error(
                "store: %d documents were not stored (%d unspillable or unreadable, "
                "%d refused, %d id conflicts); see the errors above",
                stats.lost,
                stats.dropped,
                stats.refused,
                stats.conflicts,
            )

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _write(self, collection: str, docs: Sequence[dict[str, Any]]) -> None:
        self._queue(collection, self._encodable(collection, docs))
        self._sent()

    def _queue(self, collection: str, docs: Sequence[dict[str, Any]]) -> None:
        """Buffer documents already checked by `_encodable`, in batches.

        Without the background thread, a write larger than the buffer's bound
        is sent as it is queued: the bound is there to spill what a server
        that does not answer leaves waiting, and spilling (then replaying) the
        documents of a server that answers would only write them twice.
        """
        size = self.options.batch_size
        for start in range(0, len(docs), size):
            batch = docs[start : start + size]
            if self._flusher is None and self._buffer.pending() + len(batch) > self._buffer.limit:
                self._flush_now()
            self._buffer.add(collection, batch)

    def _sent(self) -> None:
        """Hand what was queued to the background thread, or flush it now."""
        if self._flusher is not None:
            self._wake.set()
            return
        self._flush_now()

    def _flush_now(self) -> None:
        """Flush unless a recent failure says the server is still away; never raises."""
        with self._state:
            waiting = time.monotonic() < self._retry_at
        if waiting:
            return
        try:
            self.flush()
        except StoreUnavailable as exc:
            stats = self._buffer.stats()
            log.warning(
                "store: %s; %d documents buffered, %d spilled", exc, stats.pending, stats.spilled
            )

    def _flush_in_background(self) -> None:
        """The `background_flush` thread: flush when woken, retry a backlog while the
        server is away; what it cannot send stays buffered (and spills), never lost."""
        while not self._stopping:
            self._wake.wait(self.options.retry_interval_s)
            self._wake.clear()
            if self._stopping:
                return
            try:
                if self._buffer.has_backlog():
                    self._flush_now()
                self._remove_read()
            except Exception:  # this thread must outlive any one bad batch
                log.exception("store: background flush failed")

    def _encodable(
        self, collection: str, docs: Sequence[dict[str, Any]]
    ) -> Sequence[dict[str, Any]]:
        """The documents a server can take; the others are refused (counted, logged) here.

        Checked before buffering, so a bad document (an integer beyond 64
        bits, more than 16 MiB) can neither fail its whole batch on the
        server nor sit in memory or a spill file; both backends encode BSON
        the same way, so they refuse the same documents.
        """
        rejected: list[Rejected] = []
        kept: list[dict[str, Any]] = []
        for doc in docs:
            try:
                size = len(bson.encode(doc))
            except (bson.errors.InvalidDocument, OverflowError, TypeError, ValueError) as exc:
                rejected.append(Rejected(doc.get("_id"), f"cannot be encoded: {exc}"))
                continue
            if size > MAX_DOCUMENT_BYTES:
                rejected.append(
                    Rejected(doc.get("_id"), f"{size} bytes, over the {MAX_DOCUMENT_BYTES} limit")
                )
                continue
            kept.append(doc)
        if rejected:
            self._buffer.account(collection, InsertResult(rejected=tuple(rejected)))
            return kept
        return docs

    # -- reads ------------------------------------------------------------------

    def decisions(
        self,
        *,
        agent: AgentKind | None = None,
        run: str | None = None,
        epoch: int | None = None,
        slot: int | None = None,
        node: str | None = None,
        source: str | None = None,
        outcome: str | None = None,
        windows: bool | None = None,
        limit: int = 20,
    ) -> list[AnyDecision]:
        """The latest decisions matching every given filter, newest first.

        `source` is `llm`, `rule` or `fallback`; `outcome` a `Decision.outcome`.
        `windows`: True, only a gateway's routing windows (`trigger` "window",
        stored in the scheduler's collection beside its slot maps); False, none of them.
        """
        if limit < 1:
            raise StoreError(f"limit must be at least 1, got {limit}")
        query = _filter(run=run, epoch=epoch, slot=slot, node=node, source=source, outcome=outcome)
        if windows is not None:
            query["trigger"] = WINDOW_TRIGGER if windows else {"$ne": WINDOW_TRIGGER}
        agents = [agent] if agent else list(DECISION_COLLECTIONS)
        found: list[tuple[int, AnyDecision]] = []
        for kind in agents:
            model = DECISION_MODELS[kind]
            for doc in self._backend.find(
                DECISION_COLLECTIONS[kind], query, sort=[("_seq", -1)], limit=limit
            ):
                for d in _valid(model, [doc], DECISION_COLLECTIONS[kind]):
                    found.append((int(doc.get("_seq") or 0), cast(AnyDecision, d)))
        found.sort(key=lambda item: item[0], reverse=True)
        if not found:
            self._check_run(run)
        return [d for _, d in found[:limit]]

    def requests(self, run: str, *, lm: str | None = None) -> Iterator[RequestRecord]:
        """Request records of `run` in submit order (streamed)."""
        self._check_run(run)
        query = _filter(run=run, lm=lm)
        docs = self._backend.find("requests", query, sort=[("submit_s", 1), ("_id", 1)])
        for record in _valid(RequestRecord, docs, "requests"):
            yield cast(RequestRecord, record)

    def requests_after(self, cursor: RecordCursor) -> list[RequestRecord]:
        """The records of `cursor.run` fed (`record_requests(feed=True)`) and not yet
        returned, oldest first; each is returned once.

        The read never scans the run: it reads the feed, which holds only the
        records not read yet (about a slot's worth), and deletes what it
        returned (with `background_flush`, from the background thread, off
        the caller's path; until the removal is confirmed the cursor skips
        those documents). A range query on the run's records (`_seq > last
        read`) would be index-backed on MongoDB but is a full scan on FerretDB
        v1 over SQLite, which pushes down no filter on a field other than
        `_id` and even then uses no index: seconds a call at 10,000 records.
        The feed holds the records in batches, one document per write
        (`lmedge.store.documents.feed_documents`), so a slot's read fetches
        and deletes a handful of documents whose records the server never
        parses. A record that lands late (a gateway's buffered write) is
        simply read later; a record fed again while still unread is returned
        once; a controller that restarts reads what no one has read, and
        again what it read last if it stopped before that removal was
        confirmed (`close()` sends it unless the server is away). One reader
        per run (the leader). A missing run is not an error (its records have
        not arrived yet); raises `StoreUnavailable` when the server does not
        answer the read.
        """
        with self._state:
            # Taken before the find: a removal confirmed after it may have come too late for it.
            skip = set(cursor.unconfirmed)
        batches = self._backend.find(FEED, {"run": cursor.run}, sort=[("_seq", 1)])
        fields: list[dict[str, Any]] = []
        read: list[str] = []
        seen: set[tuple[Any, Any]] = set()  # (origin, id): a record's key within its run
        for batch in batches:
            batch_id = str(batch.get("_id"))
            read.append(batch_id)
            if batch_id in skip:
                continue
            try:
                records = feed_records(batch)
            except ValueError as exc:  # its records are in `requests`; the feed cannot say which
                log.error("store: feed document %r skipped: %s", batch_id, exc)
                continue
            for record in records:
                key = (record.get("origin"), record.get("id"))
                if key not in seen:
                    seen.add(key)
                    fields.append(record)
        fresh = _records(fields)
        with self._state:
            cursor.unconfirmed.difference_update(skip.difference(read))  # no longer in the feed
            cursor.unconfirmed.update(read)
        if not read:
            return fresh
        if self._flusher is None:
            self._remove(cursor, read)
            return fresh
        # The removal is a write of the slot: the background thread sends it with the
        # slot's other writes (they wake it; at the latest after `retry_interval_s`),
        # not while the caller is still making them.
        with self._state:
            self._removals.append((cursor, read))
        return fresh

    def _remove_read(self) -> None:
        """Delete the feed documents `requests_after` returned (`background_flush`)."""
        with self._state:
            removals, self._removals = self._removals, []
        for cursor, ids in removals:
            self._remove(cursor, ids)

    def _remove(self, cursor: RecordCursor, ids: list[str]) -> None:
        """Delete returned feed documents; never raises (the next read finds them, skips
        them as unconfirmed and asks again)."""
        try:
            self._backend.delete(FEED, ids)
        except (StoreError, StoreUnavailable) as exc:
            log.warning("store: %d feed documents read but not yet removed: %s", len(ids), exc)
            return
        with self._state:
            cursor.unconfirmed.difference_update(ids)

    def lm_stats(self, run: str) -> list[LMStats]:
        """Per-LM arrivals, successes, success ratio, success-only mean latency and
        requests refused by admission control (failures, counted in arrivals)."""
        self._check_run(run)
        groups = self._backend.group("requests", {"run": run}, ("lm", "outcome"), "latency_s")
        per_lm: dict[str, list[float]] = {}
        for (lm, outcome), (n, latency) in groups.items():
            acc = per_lm.setdefault(str(lm), [0, 0, 0.0, 0])
            acc[0] += n
            if outcome == "success":
                acc[1] += n
                acc[2] += latency
            elif outcome == "rejected":
                acc[3] += n
        return [
            LMStats(
                lm=lm,
                arrivals=int(arrivals),
                successes=int(successes),
                success_ratio=successes / arrivals if arrivals else None,
                mean_latency_s=latency / successes if successes else None,
                rejected=int(rejected),
            )
            for lm, (arrivals, successes, latency, rejected) in sorted(per_lm.items())
        ]

    def telemetry(
        self, *, node: str | None = None, run: str | None = None, limit: int = 100
    ) -> list[NodeTelemetry]:
        """The latest telemetry snapshots (by `time_s`), newest first."""
        query = _filter(node=node, run=run)
        docs = self._backend.find("telemetry", query, sort=[("time_s", -1)], limit=limit)
        return [cast(NodeTelemetry, t) for t in _valid(NodeTelemetry, docs, "telemetry")]

    def memory_cases(self, *, run: str | None = None, limit: int = 10) -> list[MemoryCase]:
        """Episodic memory, best objective first (cases without one come last).

        Best is the *lowest* J (the objective is minimized), so with a limit
        the worst cases are the ones left out. Ties: the later epoch first.
        MongoDB sorts a null objective before every number in ascending
        order, so the unscored cases are counted first and skipped (equality
        filters only: the embedded backend has no `$ne`). `limit=0` means no
        limit.
        """
        query = _filter(run=run)
        unscored = {**query, "objective": None}
        nulls = self._backend.count("memory", unscored)
        docs = self._backend.find(
            "memory",
            query,
            sort=[("objective", 1), ("epoch", -1)],
            limit=limit + nulls if limit > 0 else 0,
        )
        ranked = [d for d in docs if d.get("objective") is not None]
        if limit > 0:
            ranked = ranked[:limit]
        if nulls and (limit <= 0 or len(ranked) < limit):
            rest = limit - len(ranked) if limit > 0 else 0
            ranked += self._backend.find("memory", unscored, sort=[("epoch", -1)], limit=rest)
        return [cast(MemoryCase, c) for c in _valid(MemoryCase, ranked, "memory")]

    def runs(self, *, limit: int = 50) -> list[RunInfo]:
        """Registered runs, most recently started first; raises on an empty store."""
        docs = list(self._backend.find("runs", {}, sort=[("started", -1)], limit=limit))
        if not docs:
            self._raise_empty()
        return [cast(RunInfo, r) for r in _valid(RunInfo, docs, "runs")]

    def run(self, run_id: str) -> RunInfo | None:
        """The run registered as `run_id` (None when there is none, or it does not validate)."""
        docs = self._backend.find("runs", {"_id": run_id}, limit=1)
        return next((cast(RunInfo, r) for r in _valid(RunInfo, docs, "runs")), None)

    def totals(self, run_id: str) -> RunTotals | None:
        """The totals stored for `run_id` (None: none stored, as for a cluster run)."""
        docs = self._backend.find("run_totals", {"_id": run_id}, limit=1)
        return next((cast(RunTotals, t) for t in _valid(RunTotals, docs, "run_totals")), None)

    def latest_run(self, *, backend: str | None = None) -> RunInfo | None:
        """The most recently started run (of `backend` only, when given); None without one."""
        docs = self._backend.find("runs", _filter(backend=backend), sort=[("started", -1)], limit=1)
        return next((cast(RunInfo, r) for r in _valid(RunInfo, docs, "runs")), None)

    def status(self) -> StoreStatus:
        """Documents per collection and the latest run; raises on an empty store."""
        counts = {name: self._backend.count(name, {}) for name in COLLECTIONS}
        if not any(counts.values()):
            self._raise_empty()
        latest = next(iter(self._backend.find("runs", {}, sort=[("started", -1)], limit=1)), None)
        return StoreStatus(
            backend=self.backend,
            where=self.where,
            counts=counts,
            latest_run=next((cast(RunInfo, r) for r in _valid(RunInfo, [latest], "runs")), None)
            if latest
            else None,
            validators=self._backend.validators,
            ttl=self._backend.ttl,
            buffer=self._buffer.stats(),
        )

    def _check_run(self, run: str | None) -> None:
        """Explain an empty answer: an unknown run or an empty store is a user error."""
        if run is None or self._backend.count("runs", {"_id": run}):
            return
        known = [d["_id"] for d in self._backend.find("runs", {}, projection={"_id": 1})]
        if not known and not any(self._backend.count(c, {}) for c in COLLECTIONS):
            self._raise_empty()
        if known and self._backend.count("requests", {"run": run}) == 0:
            shown = ", ".join(sorted(known)[:5]) + (", ..." if len(known) > 5 else "")
            raise StoreError(f"no run {run!r} in {self.where} (runs: {shown})")

    def _raise_empty(self) -> None:
        raise StoreError(f"{self.where} is empty: no run has been recorded there yet")


def _valid(
    model: type[BaseModel], docs: Iterable[Mapping[str, Any]], collection: str
) -> Iterator[Any]:
    """The documents that validate as `model`; each one that does not is logged and skipped.

    A document another version of lmedge (or a person in mongosh) wrote must
    not make every read of its collection fail, nor stop a component that
    reads it (the node agent reads the planner's latest policy).
    """
    for doc in docs:
        try:
            yield from_document(model, doc)
        except (ValidationError, TypeError, ValueError) as exc:
            first = str(exc).splitlines()[:3]
            log.error(
                "store: document %r in %s skipped: not a valid %s (%s)",
                doc.get("_id"),
                collection,
                model.__name__,
                "; ".join(first)[:300],
            )


#: Validates a list of records in one call (the loop in pydantic-core, not Python).
_RECORD_LIST: Final = TypeAdapter(list[RequestRecord])


def _records(fields: list[dict[str, Any]]) -> list[RequestRecord]:
    """Validate records' fields (`feed_records`): all at once; one by one, the bad
    logged and skipped as by `_valid`, only when one does not validate."""
    try:
        return _RECORD_LIST.validate_python(fields)
    except ValidationError:
        return [cast(RequestRecord, r) for r in _valid(RequestRecord, fields, FEED)]


def _filter(**fields: object) -> dict[str, Any]:
    """An equality filter on the fields that are not None."""
    return {k: v for k, v in fields.items() if v is not None}
