"""The two document backends behind `Store`: a MongoDB-protocol server, or MontyDB.

This is the only module that imports pymongo or montydb. Both speak the pymongo
collection API, so `Store` builds one set of queries; the differences handled
here are the ones measured against the real servers:

* errors: pymongo errors become `StoreUnavailable` (the server did not answer:
  retry later) or `StoreError` (the server refused: retrying will not help);
* idempotent batch insert: a duplicate `_id` is "already stored" only when the
  stored document has the same content (a replay after an outage); a
  different document under a known `_id` is a *conflict*, returned in the
  `InsertResult` and never stored over the first. MongoDB and FerretDB report
  duplicates per document (code 11000) and insert the rest of an unordered
  batch; the embedded backend looks the batch's `_id`s up by primary key
  before inserting (`lmedge.store.montypatch.insert_new`). A document the
  server refuses (a validator) or that cannot be encoded is returned as
  refused; the rest of its batch is stored;
* validators and TTL indexes: used where the server accepts them, detected by
  trying (FerretDB v1 answers `NotImplemented`, code 238; MontyDB ignores
  indexes altogether, so it has neither);
* grouping: MontyDB has no `aggregate`, so it groups in Python. FerretDB v1
  computes only the first accumulator of a `$group` stage (the others come back
  as 0), so the server path runs one single-accumulator pipeline per sum.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import bson.errors
import montydb
import montydb.errors
import pymongo
import pymongo.collection
import pymongo.errors
from pymongo import uri_parser

from lmedge.errors import StoreError, StoreUnavailable
from lmedge.store.documents import CollectionSpec
from lmedge.store.location import StoreLocation
from lmedge.store.montypatch import apply as _apply_montydb_fix
from lmedge.store.montypatch import insert_new as _insert_new
from lmedge.store.outcomes import InsertResult, Rejected, same_record

_MONTYDB_PATCHED = _apply_montydb_fix()

__all__ = ["Backend", "EmbeddedBackend", "MongoBackend", "open_backend"]

log = logging.getLogger(__name__)

Doc = dict[str, Any]
Sort = Sequence[tuple[str, int]]
#: Group key (values of the key fields) -> (documents, sum of the summed field).
Groups = dict[tuple[Any, ...], tuple[int, float]]

_DUPLICATE_KEY = 11000
_NOT_IMPLEMENTED = frozenset({238, 59, 115})  # NotImplemented, CommandNotFound, NotSupported
#: Defaults for a server URI that does not set them (milliseconds). Selection and
#: connection are short, so a server that is down costs the control loop about a
#: second per attempt, not pymongo's 30 s. The socket timeout only bounds a server
#: that accepted a request and then went silent; it must outlast the slowest
#: legitimate read (FerretDB v1 scans 20,000 request records in about 10 s).
_MONGO_TIMEOUTS_MS = {
    "serverSelectionTimeoutMS": 1000,
    "connectTimeoutMS": 1000,
    "socketTimeoutMS": 30000,
}


def _classify_duplicates(
    docs: Sequence[Doc], stored: Mapping[Any, Mapping[str, Any]]
) -> tuple[int, list[Rejected]]:
    """Split documents whose `_id` is taken into replays and conflicts."""
    duplicates, conflicts = 0, []
    for doc in docs:
        existing = stored.get(doc["_id"])
        if existing is not None and same_record(existing, doc):
            duplicates += 1
        else:
            conflicts.append(
                Rejected(doc["_id"], "its _id is stored with different content", conflict=True)
            )
    return duplicates, conflicts


class Backend(ABC):
    """A document database holding the lmedge collections."""

    kind: str
    #: Where the data is, for messages (never credentials).
    where: str
    #: Which server *and database* (or directory) this is, never credentials:
    #: what a spill file is keyed by, so it is replayed only into its own store.
    identity: str
    validators: bool = False
    ttl: bool = False

    @abstractmethod
    def ensure(self, specs: Sequence[CollectionSpec], telemetry_ttl_s: int) -> None:
        """Create collections, indexes and (where supported) validators and TTL."""

    @abstractmethod
    def insert(self, collection: str, docs: Sequence[Doc]) -> InsertResult:
        """Insert documents; an `_id` already stored is never overwritten.

        Per-document problems (a conflict, a refusal, a document that cannot
        be encoded) are in the result, and the rest of the batch is stored.
        Raises `StoreUnavailable` when the server does not answer and
        `StoreError` when it refuses the batch as a whole.
        """

    @abstractmethod
    def find(
        self,
        collection: str,
        filter: Mapping[str, Any],
        *,
        projection: Mapping[str, Any] | None = None,
        sort: Sort = (),
        limit: int = 0,
    ) -> Iterator[Doc]:
        """Documents matching `filter`, sorted, at most `limit` (0 = all)."""

    @abstractmethod
    def count(self, collection: str, filter: Mapping[str, Any]) -> int:
        """Number of documents matching `filter`."""

    @abstractmethod
    def delete(self, collection: str, ids: Sequence[Any]) -> int:
        """Delete the documents with these `_id`s; the number deleted.

        Raises `StoreUnavailable` when the server does not answer.
        """

    @abstractmethod
    def group(
        self, collection: str, match: Mapping[str, Any], keys: Sequence[str], summed: str
    ) -> Groups:
        """Count matching documents and sum the field `summed` per value of `keys`."""

    @abstractmethod
    def close(self) -> None:
        """Release connections and files."""


class MongoBackend(Backend):
    """A MongoDB-wire-protocol server (MongoDB, FerretDB) through pymongo."""

    kind = "mongodb"

    def __init__(self, location: StoreLocation) -> None:
        self.where = location.describe()
        try:
            parsed = uri_parser.parse_uri(location.uri)
            given = {k.lower() for k in parsed["options"]}
            timeouts: dict[str, Any] = {
                k: v for k, v in _MONGO_TIMEOUTS_MS.items() if k.lower() not in given
            }
            self._client: pymongo.MongoClient[Doc] = pymongo.MongoClient(
                location.uri, tz_aware=True, appname="lmedge", **timeouts
            )
        except (pymongo.errors.ConfigurationError, ValueError) as exc:
            raise StoreError(f"malformed MongoDB URI: {exc}") from exc
        self._db = self._client[parsed["database"] or "lmedge"]
        hosts = ",".join(sorted(f"{h}:{p}" for h, p in parsed["nodelist"])) or location.uri
        self.identity = f"mongodb://{hosts}/{self._db.name}"
        try:
            self._client.admin.command("ping")
        except pymongo.errors.PyMongoError as exc:
            self._client.close()
            raise StoreError(f"cannot reach {self.where}: {_short(exc)}") from exc

    @contextmanager
    def _errors(self, action: str) -> Iterator[None]:
        try:
            yield
        except pymongo.errors.ConnectionFailure as exc:  # includes timeouts, AutoReconnect
            msg = f"{self.where} did not answer ({action}): {_short(exc)}"
            raise StoreUnavailable(msg) from exc
        except pymongo.errors.PyMongoError as exc:
            raise StoreError(f"{self.where} refused {action}: {_short(exc)}") from exc

    def ensure(self, specs: Sequence[CollectionSpec], telemetry_ttl_s: int) -> None:
        with self._errors("creating collections"):
            existing = set(self._db.list_collection_names())
            self.validators = self._ensure_validators(specs, existing)
            for spec in specs:
                coll = self._db[spec.name]
                for index in spec.indexes:
                    coll.create_index(list(index.keys), name=index.name)
            self.ttl = self._ensure_ttl(telemetry_ttl_s)

    def _ensure_validators(self, specs: Sequence[CollectionSpec], existing: set[str]) -> bool:
        supported = True
        for spec in specs:
            validator = {"$jsonSchema": spec.validator()}
            try:
                if not supported:
                    if spec.name not in existing:
                        self._db.create_collection(spec.name)
                elif spec.name in existing:
                    self._db.command("collMod", spec.name, validator=validator)
                else:
                    self._db.create_collection(spec.name, validator=validator)
            except pymongo.errors.OperationFailure as exc:
                if exc.code not in _NOT_IMPLEMENTED:
                    raise
                log.info("%s does not support $jsonSchema validators", self.where)
                supported = False
                if spec.name not in existing:
                    self._db.create_collection(spec.name)
        return supported

    def _ensure_ttl(self, telemetry_ttl_s: int) -> bool:
        from lmedge.store.documents import telemetry_ttl_index

        index = telemetry_ttl_index(telemetry_ttl_s)
        coll = self._db["telemetry"]
        try:
            if index.name in coll.index_information():
                # A changed retention: TTL is one of the few index options collMod edits.
                self._db.command(
                    "collMod",
                    "telemetry",
                    index={"name": index.name, "expireAfterSeconds": telemetry_ttl_s},
                )
            else:
                coll.create_index(
                    list(index.keys), name=index.name, expireAfterSeconds=telemetry_ttl_s
                )
        except pymongo.errors.OperationFailure as exc:
            if exc.code not in _NOT_IMPLEMENTED:
                raise
            log.info("%s does not support TTL indexes; telemetry does not expire", self.where)
            return False
        return True

    def insert(self, collection: str, docs: Sequence[Doc]) -> InsertResult:
        if not docs:
            return InsertResult()
        docs = list(docs)
        coll = self._db[collection]
        with self._errors(f"an insert into {collection}"):
            try:
                result = coll.insert_many(docs, ordered=False)
            except pymongo.errors.BulkWriteError as exc:
                if exc.details.get("writeConcernErrors"):
                    raise
                return self._partial(coll, docs, exc.details)
            except (bson.errors.InvalidDocument, OverflowError) as exc:
                # Encoding failed client-side, maybe after part of the batch was
                # sent: the caller retries document by document (replays are harmless).
                raise StoreError(f"a document for {collection} cannot be encoded: {exc}") from exc
            return InsertResult(inserted=len(result.inserted_ids))

    def _partial(
        self, coll: pymongo.collection.Collection[Doc], docs: list[Doc], details: Mapping[str, Any]
    ) -> InsertResult:
        """The per-document outcome of an unordered batch that had write errors."""
        errors = details.get("writeErrors", [])
        taken = [docs[e["index"]] for e in errors if e.get("code") == _DUPLICATE_KEY]
        rejected = [
            Rejected(docs[e["index"]]["_id"], f"refused by the server: {_short_msg(e)}")
            for e in errors
            if e.get("code") != _DUPLICATE_KEY
        ]
        stored: dict[Any, Doc] = {}
        if taken:
            ids = list({d["_id"] for d in taken})
            stored = {d["_id"]: d for d in coll.find({"_id": {"$in": ids}})}
        duplicates, conflicts = _classify_duplicates(taken, stored)
        return InsertResult(
            inserted=int(details.get("nInserted", 0)),
            duplicates=duplicates,
            rejected=(*conflicts, *rejected),
        )

    def find(
        self,
        collection: str,
        filter: Mapping[str, Any],
        *,
        projection: Mapping[str, Any] | None = None,
        sort: Sort = (),
        limit: int = 0,
    ) -> Iterator[Doc]:
        with self._errors(f"a query of {collection}"):
            cursor = self._db[collection].find(dict(filter), projection, limit=limit)
            if sort:
                cursor = cursor.sort(list(sort))
            yield from cursor

    def count(self, collection: str, filter: Mapping[str, Any]) -> int:
        with self._errors(f"a count of {collection}"):
            return self._db[collection].count_documents(dict(filter))

    def delete(self, collection: str, ids: Sequence[Any]) -> int:
        if not ids:
            return 0
        with self._errors(f"a delete from {collection}"):
            return int(self._db[collection].delete_many({"_id": {"$in": list(ids)}}).deleted_count)

    def group(
        self, collection: str, match: Mapping[str, Any], keys: Sequence[str], summed: str
    ) -> Groups:
        group_id = {k: f"${k}" for k in keys}
        out: dict[tuple[Any, ...], list[float]] = {}
        with self._errors(f"an aggregation of {collection}"):
            # One accumulator per pipeline: FerretDB v1 zeroes all but the first.
            for slot, acc in enumerate(({"$sum": 1}, {"$sum": f"${summed}"})):
                pipeline = [{"$match": dict(match)}, {"$group": {"_id": group_id, "v": acc}}]
                for row in self._db[collection].aggregate(pipeline):
                    key = tuple(row["_id"].get(k) for k in keys)
                    out.setdefault(key, [0.0, 0.0])[slot] = float(row["v"])
        return {k: (int(n), total) for k, (n, total) in out.items()}

    def close(self) -> None:
        self._client.close()


class EmbeddedBackend(Backend):
    """MontyDB over SQLite in a local directory: no server, single machine.

    MontyDB is pure Python: every query decodes the whole collection in the
    calling process (about 15,000 documents/s), so it suits runs of up to a few
    hundred thousand records. Writes go in batches, one SQLite transaction each,
    with `synchronous=OFF`: in WAL mode a crash of lmedge loses nothing and the
    file cannot be corrupted; only an OS crash or power cut may lose the last
    transactions, a fair price for 7x faster single inserts (31 ms -> 4.6 ms on
    the development VM) on a single-machine run.
    """

    kind = "embedded"
    _DATABASE = "lmedge"

    def __init__(self, location: StoreLocation, *, create: bool) -> None:
        assert location.path is not None
        path = location.path
        self.where = location.describe()
        if path.exists() and not path.is_dir():
            raise StoreError(f"{self.where} is a file, not a directory")
        if not path.exists() and not create:
            raise StoreError(f"no store at {path}: nothing has been recorded there yet")
        if not _MONTYDB_PATCHED:
            raise StoreError(
                f"cannot open {self.where}: this montydb version is not the one lmedge "
                "was written for (install montydb 2.5.x)"
            )
        self.identity = f"embedded://{path.resolve()}"
        try:
            if not (path / ".monty.storage").exists():
                path.mkdir(parents=True, exist_ok=True)
                # BSON encoding keeps datetimes and 64-bit ints exactly as a server does.
                montydb.set_storage(str(path), storage="sqlite", use_bson=True)
            self._client = montydb.MontyClient(str(path), tz_aware=True, synchronous="OFF")
        except (OSError, montydb.errors.MontyError, sqlite3.Error) as exc:
            raise StoreError(f"cannot open {self.where}: {exc}") from exc
        self._db = self._client[self._DATABASE]
        # One connection for the process: the controller's background flush inserts
        # while its slot path reads the feed, and MontyDB's SQLite storage is not
        # safe for two threads at once (an intermittent sqlite3 error otherwise).
        self._lock = threading.RLock()

    @contextmanager
    def _errors(self, action: str) -> Iterator[None]:
        try:
            with self._lock:
                yield
        except sqlite3.OperationalError as exc:  # "database is locked" by another writer
            raise StoreUnavailable(f"{self.where} is busy ({action}): {exc}") from exc
        except (OSError, sqlite3.Error, montydb.errors.MontyError) as exc:
            raise StoreError(f"{self.where} failed {action}: {exc}") from exc

    def ensure(self, specs: Sequence[CollectionSpec], telemetry_ttl_s: int) -> None:
        # MontyDB keeps no indexes, validators or TTL: nothing to create up front.
        self.validators = False
        self.ttl = False

    def insert(self, collection: str, docs: Sequence[Doc]) -> InsertResult:
        if not docs:
            return InsertResult()
        first: dict[Any, Doc] = {}
        again: list[Doc] = []  # an `_id` seen earlier in this batch
        for doc in docs:
            if doc["_id"] in first:
                again.append(doc)
            else:
                first[doc["_id"]] = doc
        with self._errors(f"an insert into {collection}"):
            stored, unencodable = _insert_new(self._db[collection], list(first.values()))
        refused = {doc_id for doc_id, _ in unencodable}
        duplicates, conflicts = _classify_duplicates(
            [d for d in first.values() if d["_id"] in stored], stored
        )
        # A repeat inside the batch is checked against what now holds its `_id`.
        holders = {k: stored.get(k, d) for k, d in first.items() if k not in refused}
        repeats, repeat_conflicts = _classify_duplicates(
            [d for d in again if d["_id"] in holders], holders
        )
        rejected = [Rejected(doc_id, reason) for doc_id, reason in unencodable]
        rejected += [Rejected(d["_id"], "cannot be encoded") for d in again if d["_id"] in refused]
        return InsertResult(
            inserted=len(first) - len(stored) - len(refused),
            duplicates=duplicates + repeats,
            rejected=(*conflicts, *repeat_conflicts, *rejected),
        )

    def find(
        self,
        collection: str,
        filter: Mapping[str, Any],
        *,
        projection: Mapping[str, Any] | None = None,
        sort: Sort = (),
        limit: int = 0,
    ) -> Iterator[Doc]:
        # MontyDB's own filter, sort and projection run through its generic
        # field walker at ~0.1-0.25 ms per document each, five to ten times its
        # decoding cost; the store only ever filters by equality on top-level
        # fields, so decoding everything and doing the rest here is much faster.
        matches = _equality(filter)
        docs: list[Doc] = []
        with self._errors(f"a query of {collection}"), _while_created():
            docs = [d for d in self._db[collection].find() if matches(d)]
        # Stable sorts, least significant key first, give the compound order.
        for key, direction in reversed(sort):
            docs.sort(key=_sort_key(key), reverse=direction < 0)
        if limit:
            docs = docs[:limit]
        for doc in docs:
            yield {k: doc[k] for k in projection if k in doc} if projection else doc

    def count(self, collection: str, filter: Mapping[str, Any]) -> int:
        if not filter:
            with self._errors(f"a count of {collection}"), _while_created():
                return int(self._db[collection].count_documents({}))
            return 0
        return sum(1 for _ in self.find(collection, filter, projection={"_id": 1}))

    def delete(self, collection: str, ids: Sequence[Any]) -> int:
        if not ids:
            return 0
        with self._errors(f"a delete from {collection}"), _while_created():
            return int(self._db[collection].delete_many({"_id": {"$in": list(ids)}}).deleted_count)
        return 0

    def group(
        self, collection: str, match: Mapping[str, Any], keys: Sequence[str], summed: str
    ) -> Groups:
        out: dict[tuple[Any, ...], tuple[int, float]] = {}
        projection = {k: 1 for k in (*keys, summed)}
        for doc in self.find(collection, match, projection=projection):
            key = tuple(doc.get(k) for k in keys)
            n, total = out.get(key, (0, 0.0))
            out[key] = (n + 1, total + float(doc.get(summed) or 0.0))
        return out

    def close(self) -> None:
        with self._lock:
            self._client.close()


@contextmanager
def _while_created() -> Iterator[None]:
    """Read a collection that another process is creating as an empty one.

    MontyDB creates a collection's file before its table, so a reader in
    another process can see the file without the table for a moment.
    """
    try:
        yield
    except sqlite3.OperationalError as exc:
        if "no such table" not in str(exc):
            raise


def open_backend(location: StoreLocation, *, create: bool) -> Backend:
    """Connect to the backend named by `location`."""
    if location.kind == "mongodb":
        return MongoBackend(location)
    return EmbeddedBackend(location, create=create)


def _equality(filter: Mapping[str, Any]) -> Callable[[Mapping[str, Any]], bool]:
    """A predicate for a filter of top-level equalities (a missing field equals None).

    Two operators are understood besides: `{field: {"$gt": number}}`, and
    `{field: {"$ne": value}}` (as in MongoDB, a missing field is not equal to
    a value other than None), the decisions that are not routing windows.
    """
    items: list[tuple[str, Any]] = []
    above: list[tuple[str, float]] = []
    unequal: list[tuple[str, Any]] = []
    for key, value in filter.items():
        if isinstance(value, dict) and set(value) == {"$gt"} and not key.startswith("$"):
            above.append((key, value["$gt"]))
            continue
        if isinstance(value, dict) and set(value) == {"$ne"} and not key.startswith("$"):
            unequal.append((key, value["$ne"]))
            continue
        if key.startswith("$") or "." in key or isinstance(value, dict | list):
            raise ValueError(f"the embedded store only filters by field equality, not {key!r}")
        items.append((key, value))

    def matches(doc: Mapping[str, Any]) -> bool:
        if not all(doc.get(k) == v for k, v in items):
            return False
        if any(doc.get(k) == v for k, v in unequal):
            return False
        for k, bound in above:
            v = doc.get(k)
            if not isinstance(v, int | float) or isinstance(v, bool) or not v > bound:
                return False
        return True

    return matches


def _sort_key(field: str) -> Callable[[Mapping[str, Any]], tuple[int, Any]]:
    return lambda doc: _order(doc.get(field))


def _order(value: Any) -> tuple[int, Any]:
    """MongoDB's cross-type sort order for the scalars the store sorts by."""
    if value is None:
        return (0, 0)
    if isinstance(value, bool):
        return (3, value)
    if isinstance(value, int | float):
        return (1, value)
    if isinstance(value, str):
        return (2, value)
    return (4, str(value))


def _short_msg(error: Mapping[str, Any]) -> str:
    """One write error of a bulk write, shortly (code and message)."""
    return f"code {error.get('code')}: {str(error.get('errmsg', ''))[:200]}"


def _short(exc: BaseException) -> str:
    """The first line of a driver error, without pymongo's topology dump."""
    text = str(exc).split("\n", 1)[0]
    return text.split(", Timeout:", 1)[0].split(", full error:", 1)[0][:300]
