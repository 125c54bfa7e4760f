"""Two targeted changes to MontyDB's SQLite storage (montydb 2.5.x, pinned < 3).

1. `SQLiteCollection.write_many` reads *every* stored key of the collection on
   each call and scans that list for each new document, so filling a
   collection costs O(n^2): 20,000 request records took ~17 s. Its duplicate
   check cannot even fire (it compares an encoded id with the fetched row
   tuples), so the SQLite primary key is what rejects duplicates anyway. The
   replacement keeps exactly that behaviour without the scan.
2. `SQLiteCollection.insert_new` (added): insert the documents whose `_id` is
   not stored yet and return the stored version of the others, in one SQLite
   transaction, by primary-key lookups. MontyDB's own way to the same answer
   is an `_id: {$in: [...]}` query, which decodes and matches the whole
   collection in Python: on a store holding 50 runs that made a run ~100x
   slower. The store compares the returned documents with the new ones, so a
   different record under a known `_id` is reported, never taken for a
   replay. A document that cannot be encoded (an integer beyond 64 bits, a
   non-string key) is returned as refused instead of failing the batch.
   It inserts in key order with a 64 MiB page cache: a batch of request
   records (keyed by run, worker, slot) lands all over a large collection's
   B-tree, and with SQLite's 2 MiB default each batch read, journalled and
   wrote most of its pages again (a 50-slot metro-1000 run, 880 MB stored,
   wrote 7.5 GB to disk; 5.5 GB with this and 5,000-document batches).

Both are applied once, on import, and only if the class still has the shape
they were written for; otherwise `apply` returns False and the embedded
backend refuses to open rather than run without them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from montydb.storage import sqlite as monty_sqlite

__all__ = ["apply", "insert_new"]

_original = getattr(monty_sqlite.SQLiteCollection, "write_many", None)
#: Keys per `IN (...)` lookup; SQLite builds before 3.32 allow 999 parameters.
_LOOKUP_CHUNK = 500
#: SQLite's page cache of an insert's connection, KiB (its default is 2 MiB): a
#: batch of records lands all over a large collection's B-tree.
_CACHE_KIB = 64 * 1024


def _write_many_by_primary_key(
    self: Any, docs: Any, check_keys: bool = True, ordered: bool = True
) -> list[Any]:
    if not self._database.collection_exists(self._name):
        self._database.collection_create(self._name)
    docs = list(docs)
    rows = [(monty_sqlite.bson.id_encode(d["_id"]), self._encode_doc(d, check_keys)) for d in docs]
    self._conn.write_many(self._col_path, rows, self.wconcern)
    return [d["_id"] for d in docs]


def _insert_new(
    self: Any, docs: Sequence[dict[str, Any]]
) -> tuple[dict[Any, dict[str, Any]], list[tuple[Any, str]]]:
    """Insert what is new; return ({_id: stored document}, [(_id, why refused)])."""
    if not self._database.collection_exists(self._name):
        self._database.collection_create(self._name)
    bson = monty_sqlite.bson
    rows: dict[bytes, tuple[Any, bytes]] = {}
    refused: list[tuple[Any, str]] = []
    for doc in docs:
        try:
            # No key check: MongoDB servers accept dotted keys, and the store
            # must accept the same documents on both backends.
            encoded = self._encode_doc(doc, False)
            key = bson.id_encode(doc["_id"])
        except Exception as exc:  # OverflowError, InvalidDocument, KeyError, ...
            refused.append((doc.get("_id"), f"cannot be encoded: {type(exc).__name__}: {exc}"))
            continue
        rows.setdefault(key, (doc["_id"], encoded))
    stored: dict[Any, dict[str, Any]] = {}
    table = monty_sqlite.SQLITE_RECORD_TABLE
    with self._conn._connect(self._col_path, self.wconcern) as conn, conn:
        conn.execute(f"PRAGMA cache_size=-{_CACHE_KIB}")
        keys = sorted(rows)
        for start in range(0, len(keys), _LOOKUP_CHUNK):
            chunk = keys[start : start + _LOOKUP_CHUNK]
            marks = ",".join("?" * len(chunk))
            for key, value in conn.execute(
                f"SELECT k, v FROM [{table}] WHERE k IN ({marks})", chunk
            ):
                doc_id = rows[bytes(key)][0]
                stored[doc_id] = bson.document_decode(value, codec_options=self.coptions)
        # In key order: the B-tree's pages are then each written once a batch.
        fresh = sorted((k, enc) for k, (doc_id, enc) in rows.items() if doc_id not in stored)
        if fresh:
            conn.executemany(f"INSERT INTO [{table}](k, v) VALUES (?, ?)", fresh)
    return stored, refused


def insert_new(
    collection: Any, docs: Sequence[dict[str, Any]]
) -> tuple[dict[Any, dict[str, Any]], list[tuple[Any, str]]]:
    """On a MontyDB collection: insert documents with a new `_id`, in one transaction.

    Returns the stored documents of the `_id`s already present (not
    overwritten) and the `(_id, reason)` of documents that cannot be encoded.
    Raises `sqlite3.Error` for the database itself (locked, disk full).
    """
    result: tuple[dict[Any, dict[str, Any]], list[tuple[Any, str]]]
    result = collection._storage.insert_new(collection, list(docs))
    return result


def apply() -> bool:
    """Install both; False when MontyDB's internals are not the expected ones."""
    cls = monty_sqlite.SQLiteCollection
    needed = ("_encode_doc", "_conn")  # _col_path and wconcern are set per instance
    if not all(hasattr(cls, n) for n in needed) or not hasattr(monty_sqlite, "SQLITE_RECORD_TABLE"):
        return False
    if not hasattr(monty_sqlite.SQLiteKVEngine, "_connect"):
        return False
    if getattr(cls.write_many, "__name__", "") != _write_many_by_primary_key.__name__:
        if _original is None:
            return False
        cls.write_many = _write_many_by_primary_key
    cls.insert_new = _insert_new
    return True
