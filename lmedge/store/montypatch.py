"""One targeted fix to MontyDB's SQLite storage (montydb 2.5.x, pinned < 3).

`SQLiteCollection.write_many` reads *every* stored key of the collection on
each call and scans that list for each new document, so filling a collection
costs O(n^2): 20,000 request records took ~17 s. Its duplicate check cannot
even fire (it compares an encoded id with the fetched row tuples), so the
SQLite primary key is what rejects duplicates anyway — with an
`IntegrityError` that rolls the whole batch back, which
`EmbeddedBackend.insert` already handles by re-inserting only what is missing.

The replacement keeps exactly that behaviour without the scan. It is applied
once, on import, and only if the method still has the shape it was written
for; otherwise MontyDB is left as it is.
"""

from __future__ import annotations

from typing import Any

from montydb.storage import sqlite as monty_sqlite

_original = getattr(monty_sqlite.SQLiteCollection, "write_many", None)


def _write_many_by_primary_key(
    self: Any, docs: Any, check_keys: bool = True, ordered: bool = True
) -> list[Any]:
    if not self._database.collection_exists(self._name):
        self._database.collection_create(self._name)
    docs = list(docs)
    rows = [(monty_sqlite.bson.id_encode(d["_id"]), self._encode_doc(d, check_keys)) for d in docs]
    self._conn.write_many(self._col_path, rows, self.wconcern)
    return [d["_id"] for d in docs]


def apply() -> bool:
    """Install the fix; False when MontyDB's internals are not the expected ones."""
    cls = monty_sqlite.SQLiteCollection
    if getattr(cls.write_many, "__name__", "") == _write_many_by_primary_key.__name__:
        return True
    needed = ("_encode_doc", "_conn")  # _col_path and wconcern are set per instance
    if _original is None or not all(hasattr(cls, n) for n in needed):
        return False
    cls.write_many = _write_many_by_primary_key
    return True
