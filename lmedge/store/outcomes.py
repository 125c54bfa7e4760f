"""What a batch insert did, document by document; no driver imports.

Shared by the backends (which produce it) and the write buffer (which counts
and logs it), so the buffer stays testable without a database.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

__all__ = ["STORE_FIELDS", "InsertResult", "Rejected", "same_record"]

#: Store fields that differ between two writes of one record: a record written
#: again after a failed attempt gets a new sequence number and timestamp.
STORE_FIELDS: Final = frozenset({"_seq", "_stored_at"})


@dataclass(frozen=True)
class Rejected:
    """A document a backend did not store, and why."""

    id: Any
    reason: str
    #: True when its `_id` is stored with other content (an id collision).
    conflict: bool = False


@dataclass(frozen=True)
class InsertResult:
    """The outcome of one batch insert."""

    inserted: int = 0
    #: Already stored with the same content (a replay): nothing to do.
    duplicates: int = 0
    #: Not stored: conflicts, refusals, documents that cannot be encoded.
    rejected: tuple[Rejected, ...] = ()


def same_record(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Whether two documents hold the same record (store bookkeeping aside)."""
    keys = (set(a) | set(b)) - STORE_FIELDS
    return all(a.get(k) == b.get(k) for k in keys)
