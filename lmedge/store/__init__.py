"""The document store: decisions, request records, telemetry, memory and runs.

One setting picks the backend (`--store` / `$LMEDGE_STORE`, see
`lmedge.store.location`): a MongoDB-protocol server for clusters, or the embedded
on-disk store (MontyDB over SQLite) for single-machine runs. Both hold the same
documents and answer the same `Store` methods. Only this package imports pymongo
or montydb.
"""

from __future__ import annotations

from lmedge.errors import StoreError
from lmedge.store.buffer import BufferStats
from lmedge.store.documents import AnyDecision, RunInfo
from lmedge.store.location import DEFAULT_STORE, STORE_ENV, StoreLocation, parse_store_location
from lmedge.store.repository import RecordCursor, Store, StoreOptions, StoreStatus

__all__ = [
    "DEFAULT_STORE",
    "STORE_ENV",
    "AnyDecision",
    "BufferStats",
    "RecordCursor",
    "RunInfo",
    "Store",
    "StoreLocation",
    "StoreOptions",
    "StoreStatus",
    "open_store",
    "parse_store_location",
]


def open_store(
    uri: str | None, *, options: StoreOptions | None = None, read_only: bool = False
) -> Store:
    """Open the store named by `uri` (else `$LMEDGE_STORE`, else `./.lmedge/store`).

    Connects (MongoDB: one ping, with the short timeouts of `lmedge.store.backends`),
    then, unless `read_only`, creates collections and indexes. `read_only` also
    refuses to create a missing embedded directory. Raises `StoreError` for a
    malformed URI, an unreachable server or a missing embedded store.
    """
    from lmedge.store.backends import open_backend

    location = parse_store_location(uri)
    try:
        backend = open_backend(location, create=not read_only)
    except OSError as exc:  # an embedded folder that cannot be created or opened
        where = str(location.path or location.uri)[:200]
        raise StoreError(f"cannot open the store at {where}: {exc.strerror or exc}") from exc
    store = Store(backend, options)
    if not read_only:
        try:
            store.ensure_schema()
        except BaseException:
            store.close()
            raise
    return store
