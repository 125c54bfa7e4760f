"""Where the store lives: one setting, parsed in one place.

The setting comes from `--store`, else the `LMEDGE_STORE` environment variable,
else the file named by `LMEDGE_STORE_FILE` (a mounted Secret: a URI with a
password belongs in a file, not in the environment), else the default embedded
directory. Accepted forms:

* `mongodb://host:port/db?...` or `mongodb+srv://...`: a MongoDB-protocol server
  (MongoDB, FerretDB); the database defaults to `lmedge`, and may not be one
  of the server's own (`admin`, `local`, `config`);
* `embedded:///abs/dir`, `embedded://rel/dir`, or a plain directory path: the
  embedded on-disk store (MontyDB over SQLite) for single-machine runs.

This module only classifies the string (and reads the one small file); it
imports no driver, so it is cheap to call from argument parsing.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import unquote

from lmedge.errors import StoreError

__all__ = [
    "DEFAULT_STORE",
    "STORE_ENV",
    "STORE_FILE_ENV",
    "StoreLocation",
    "parse_store_location",
    "store_setting",
]

#: Environment variable naming the store when `--store` is not given.
STORE_ENV = "LMEDGE_STORE"
#: Environment variable naming a file that holds the store URI (after `STORE_ENV`).
STORE_FILE_ENV = "LMEDGE_STORE_FILE"
#: Default store: an embedded directory under the current working directory.
DEFAULT_STORE = "./.lmedge/store"
_EMBEDDED_SCHEME = "embedded://"
_HINT = "use mongodb://host:port/db, embedded:///path/to/dir or a directory path"
#: The server's own databases: users and roles, the replication log, sharding
#: metadata. lmedge's collections, validators and TTL indexes never go there.
SYSTEM_DATABASES = ("admin", "local", "config")


@dataclass(frozen=True)
class StoreLocation:
    """A parsed store setting: which backend, and its URI or directory."""

    kind: Literal["mongodb", "embedded"]
    #: The MongoDB URI, verbatim (kind == "mongodb").
    uri: str = ""
    #: The embedded store directory (kind == "embedded").
    path: Path | None = None

    def describe(self) -> str:
        """A short human-readable name for messages (no credentials)."""
        if self.kind == "embedded":
            return f"embedded store {self.path}"
        rest = self.uri.split("://", 1)[1]
        hosts = rest.rsplit("@", 1)[-1].split("/", 1)[0].split("?", 1)[0]
        return f"MongoDB at {hosts}"


def store_setting() -> str | None:
    """The store named by the environment: `$LMEDGE_STORE`, else `$LMEDGE_STORE_FILE`'s text.

    None when neither is set; a `StoreError` when the file cannot be read.
    """
    if os.environ.get(STORE_ENV):
        return os.environ[STORE_ENV]
    path = os.environ.get(STORE_FILE_ENV)
    if not path:
        return None
    try:
        text = Path(path).read_text().strip()
    except OSError as exc:
        raise StoreError(f"{STORE_FILE_ENV}={path}: {exc.strerror or exc}") from exc
    if not text:
        raise StoreError(f"{STORE_FILE_ENV}={path} is empty")
    return text


def parse_store_location(uri: str | None) -> StoreLocation:
    """Classify a store setting; `None` falls back to the environment (`store_setting`),
    then the default.

    Raises `StoreError` for an empty string or a URI scheme lmedge cannot use.
    """
    if uri is None:
        uri = store_setting() or DEFAULT_STORE
    text = uri.strip()
    if not text:
        raise StoreError(f"the store setting is empty; {_HINT}")
    if text.startswith(("mongodb://", "mongodb+srv://")):
        database = _database(text)
        if database.lower() in SYSTEM_DATABASES:
            raise StoreError(
                f"the store URI names the MongoDB server's own database {database!r}; "
                "name a database of lmedge's own, e.g. mongodb://host:27017/lmedge "
                "(authSource=admin still authenticates against admin)"
            )
        return StoreLocation(kind="mongodb", uri=text)
    if text.startswith(_EMBEDDED_SCHEME):
        rest = text[len(_EMBEDDED_SCHEME) :]
        if not rest or rest == "/":
            raise StoreError(f"store URI {text!r} names no directory; {_HINT}")
        return StoreLocation(kind="embedded", path=Path(rest).expanduser())
    if "://" in text:
        scheme = text.split("://", 1)[0]
        raise StoreError(f"unsupported store URI scheme {scheme!r} in {text!r}; {_HINT}")
    return StoreLocation(kind="embedded", path=Path(text).expanduser())


def _database(uri: str) -> str:
    """The database a MongoDB URI names (its path), '' for none; pymongo parses the rest."""
    hosts_and_path = uri.split("://", 1)[1].rsplit("@", 1)[-1].split("?", 1)[0]
    return unquote(hosts_and_path.split("/", 1)[1]) if "/" in hosts_and_path else ""
