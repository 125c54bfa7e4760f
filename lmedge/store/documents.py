"""The collections, their indexes, and how a model becomes a stored document.

A stored document is the model's JSON form (`model_dump(mode="json")`, exactly
what the `$jsonSchema` generated from the model describes) plus a few store
fields, all prefixed with `_` except `latency_s`:

* `_id`: the natural key (run:origin:request id, run id (runs and their totals),
  run:node:time, run:epoch)
  or a UUID chosen *before* the write is buffered, so a replayed batch is
  recognised by the server as already present instead of duplicated. Request
  ids are only unique within a run (the emulator derives them from the seed,
  a client may choose its own at any node's gateway), so the run and the
  origin node are part of their `_id`: two runs, or two gateways, never
  share one. A different record under a taken `_id` is refused and
  reported (`lmedge.store.outcomes`), never mistaken for a replay;
* `_seq`: nanoseconds since the epoch at creation, strictly increasing within a
  process; "latest" means highest `_seq`;
* `_stored_at`: a BSON date, the anchor of the telemetry TTL index;
* `latency_s` (requests only): the derived end-to-end latency, stored so the
  server can aggregate it and people can query it in mongosh.

Reading strips the store fields and validates with the same model.

The one exception is the request feed (`FEED`): a feed document is a
`FeedBatch` envelope whose `records` field carries a batch of request
documents as concatenated BSON (`feed_documents`, `feed_records`), opaque to
the server. Nobody queries the feed by a record's field, and a server that
does not parse the records' fields hands a slot's records over in a few
milliseconds: FerretDB v1 spends about 0.2 ms per record parsing, filtering
and deleting field by field, ~100-200 ms for a slot's 500 when each record
is a document.
"""

from __future__ import annotations

import hashlib
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

import bson
import bson.errors
from bson.codec_options import CodecOptions
from pydantic import BaseModel, Field

from lmedge.api.base import WireModel
from lmedge.api.decisions import Decision, MacroPolicy, Placement, RoutingMap
from lmedge.api.observations import MemoryCase
from lmedge.api.records import NodeTelemetry, RequestRecord
from lmedge.api.runconfig import RunConfig
from lmedge.api.totals import RunTotals
from lmedge.store.schema import bson_schema

__all__ = [
    "COLLECTIONS",
    "DECISION_COLLECTIONS",
    "DECISION_MODELS",
    "FEED",
    "AnyDecision",
    "CollectionSpec",
    "FeedBatch",
    "Index",
    "RunInfo",
    "feed_documents",
    "feed_records",
    "from_document",
    "to_document",
]

AnyDecision = Decision[MacroPolicy] | Decision[RoutingMap] | Decision[Placement]


class RunInfo(WireModel):
    """One run of the control loop (emulated or on a cluster)."""

    id: str = Field(min_length=1, description="Run identifier, unique in the store.")
    scenario: str = Field(description="Scenario or cluster name.")
    policy: str = Field(description="Policy profile, e.g. MA or PerLLM.")
    seed: int | None = Field(default=None, description="Random seed; None on a real cluster.")
    started: datetime = Field(default_factory=lambda: datetime.now(UTC))
    backend: str = Field(default="emulated", description="emulated or kubernetes.")
    config: RunConfig | None = Field(
        default=None,
        description="The run's loop constants and policy; every node agent and gateway "
        "of a cluster run reads them from here (None: a run recorded without one).",
    )


class FeedBatch(WireModel):
    """The envelope of one feed document: records of one run written together.

    The records themselves are in the document's `records` field (BSON binary:
    their stored documents, store bookkeeping aside, concatenated), which the
    model does not declare because it is never JSON: see `feed_documents`.
    """

    run: str = Field(min_length=1, description="The run of every record in the batch.")
    count: int = Field(ge=1, description="Records in the batch.")


@dataclass(frozen=True)
class Index:
    """A secondary index: `keys` as (field, 1 | -1) pairs."""

    keys: tuple[tuple[str, int], ...]
    name: str
    #: Seconds after `keys[0]` (a BSON date) when the server deletes the document.
    expire_after_s: int | None = None


@dataclass(frozen=True)
class CollectionSpec:
    """A collection: its name, document model, indexes and store-added fields."""

    name: str
    model: type[BaseModel]
    indexes: tuple[Index, ...] = ()
    #: Store fields beyond the model, as `$jsonSchema` properties.
    extra_properties: Mapping[str, Any] = field(default_factory=dict)

    def validator(self) -> dict[str, Any]:
        """The `$jsonSchema` validator of this collection's documents."""
        return bson_schema(self.model, extra_properties=self.extra_properties)


_STORE_FIELDS: Final[dict[str, Any]] = {
    "_id": {"bsonType": "string"},
    "_seq": {"bsonType": "long"},
    "_stored_at": {"bsonType": "date"},
}
_DECISION_INDEXES = (
    Index((("run", 1), ("epoch", 1), ("slot", 1), ("node", 1)), "run_epoch_slot_node"),
    Index((("_seq", -1),), "latest"),
)

#: The three decision kinds, one collection each, keyed by `Decision.agent`.
DECISION_COLLECTIONS: Final[dict[str, str]] = {
    "planner": "macro_policies",
    "scheduler": "routing_maps",
    "deployer": "deployments",
}
DECISION_MODELS: Final[dict[str, type[BaseModel]]] = {
    "planner": Decision[MacroPolicy],
    "scheduler": Decision[RoutingMap],
    "deployer": Decision[Placement],
}


def telemetry_ttl_index(expire_after_s: int) -> Index:
    """The TTL index deleting telemetry `expire_after_s` seconds after it was stored."""
    return Index((("_stored_at", 1),), "expire", expire_after_s=expire_after_s)


#: The collection of request records not yet read by the controller.
FEED: Final = "request_feed"

COLLECTIONS: Final[dict[str, CollectionSpec]] = {
    **{
        name: CollectionSpec(
            name, DECISION_MODELS[agent], _DECISION_INDEXES, extra_properties=_STORE_FIELDS
        )
        for agent, name in DECISION_COLLECTIONS.items()
    },
    "requests": CollectionSpec(
        "requests",
        RequestRecord,
        (
            Index((("run", 1), ("submit_s", 1)), "run_submit"),
            Index((("run", 1), ("lm", 1), ("outcome", 1)), "run_lm_outcome"),
        ),
        extra_properties={**_STORE_FIELDS, "latency_s": {"bsonType": ["double", "int", "long"]}},
    ),
    # The gateways' records the controller has not read yet (`Store.requests_after`),
    # in batches (`feed_documents`): consumed as read, so it holds about a slot's
    # records however long the run.
    FEED: CollectionSpec(
        FEED,
        FeedBatch,
        (Index((("run", 1), ("_seq", 1)), "run_seq"),),
        extra_properties={**_STORE_FIELDS, "records": {"bsonType": "binData"}},
    ),
    "telemetry": CollectionSpec(
        "telemetry",
        NodeTelemetry,
        (
            Index((("node", 1), ("time_s", 1)), "node_time"),
            Index((("run", 1), ("node", 1), ("time_s", 1)), "run_node_time"),
        ),
        extra_properties=_STORE_FIELDS,
    ),
    "memory": CollectionSpec(
        "memory",
        MemoryCase,
        (Index((("run", 1), ("objective", -1)), "run_objective"),),
        extra_properties=_STORE_FIELDS,
    ),
    "runs": CollectionSpec(
        "runs", RunInfo, (Index((("started", -1),), "started"),), extra_properties=_STORE_FIELDS
    ),
    # One per run, keyed by it: what an emulated run measured that its other
    # documents cannot give back (`lmedge.api.totals`).
    "run_totals": CollectionSpec("run_totals", RunTotals, extra_properties=_STORE_FIELDS),
}

_seq_lock = threading.Lock()
_last_seq = 0


def next_seq() -> int:
    """Nanoseconds since the epoch, strictly increasing within this process."""
    global _last_seq
    with _seq_lock:
        _last_seq = max(_last_seq + 1, time.time_ns())
        return _last_seq


def document_id(model: BaseModel) -> str:
    """The `_id` of a model's document: its natural key, else a fresh UUID."""
    if isinstance(model, RequestRecord):
        return f"{model.run}:{model.origin}:{model.id}"
    if isinstance(model, RunInfo):
        return model.id
    if isinstance(model, RunTotals):
        return model.run
    if isinstance(model, NodeTelemetry):
        return f"{model.run}:{model.node}:{model.time_s!r}"
    if isinstance(model, MemoryCase):
        return f"{model.run}:{model.epoch}"
    return uuid.uuid4().hex


def to_document(model: BaseModel) -> dict[str, Any]:
    """The stored document of `model` (its JSON form plus the store fields)."""
    doc = model.model_dump(mode="json")
    if isinstance(model, RequestRecord):
        doc["latency_s"] = model.latency_s
    doc["_id"] = document_id(model)
    doc["_seq"] = next_seq()
    doc["_stored_at"] = datetime.now(UTC)
    return doc


def from_document(model: type[BaseModel], doc: Mapping[str, Any]) -> Any:
    """Validate a stored document back into `model`, ignoring the store fields."""
    return model.model_validate(_model_fields(model, doc))


def _model_fields(model: type[BaseModel], doc: Mapping[str, Any]) -> dict[str, Any]:
    """A stored document of `model` without the fields the store added."""
    derived = _DERIVED.get(model, ())
    return {k: v for k, v in doc.items() if not k.startswith("_") and k not in derived}


#: Fields the store adds to a model's document (not model fields), per model.
_DERIVED: Final[dict[type[BaseModel], tuple[str, ...]]] = {RequestRecord: ("latency_s",)}


#: The most bytes of records one feed document carries: a quarter of the 16 MiB a
#: BSON document may hold, so the envelope always fits (about 10,000 records).
FEED_BATCH_BYTES: Final = 4 * 1024 * 1024
_FEED_CODEC: Final[CodecOptions[dict[str, Any]]] = CodecOptions(tz_aware=True)


def feed_documents(docs: Sequence[Mapping[str, Any]], batch_size: int) -> list[dict[str, Any]]:
    """The feed documents carrying the request documents `docs`, in their order.

    One per run and at most `batch_size` records (and `FEED_BATCH_BYTES`).
    Each carries its records' fields (their documents without the fields the
    store adds), and its `_id` is the run and a digest of the records'
    `_id`s: the same records fed again are the same document, recognised by
    the server as a replay (as when each record was a feed document of its
    own). Every document must be BSON-encodable (`Store` checks that before
    it buffers them).
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    runs: dict[str, list[tuple[str, bytes]]] = {}
    for doc in docs:
        body = _model_fields(RequestRecord, doc)
        runs.setdefault(str(doc["run"]), []).append((str(doc["_id"]), bson.encode(body)))
    out: list[dict[str, Any]] = []
    for run, encoded in runs.items():
        chunk: list[tuple[str, bytes]] = []
        size = 0
        for item in encoded:
            if chunk and (len(chunk) >= batch_size or size + len(item[1]) > FEED_BATCH_BYTES):
                out.append(_feed_document(run, chunk))
                chunk, size = [], 0
            chunk.append(item)
            size += len(item[1])
        if chunk:
            out.append(_feed_document(run, chunk))
    return out


def _feed_document(run: str, chunk: Sequence[tuple[str, bytes]]) -> dict[str, Any]:
    digest = hashlib.sha1("\n".join(doc_id for doc_id, _ in chunk).encode()).hexdigest()
    doc = FeedBatch(run=run, count=len(chunk)).model_dump(mode="json")
    doc["records"] = b"".join(body for _, body in chunk)
    doc["_id"] = f"{run}:feed:{digest[:24]}"
    doc["_seq"] = next_seq()
    doc["_stored_at"] = datetime.now(UTC)
    return doc


def feed_records(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The fields of the request records a feed document carries, in the order
    they were fed (`RequestRecord.model_validate` each; not validated here).

    A feed document without `records` is a record fed on its own (as lmedge
    fed them before batching): it is its own record. Raises `ValueError` for
    a `records` field that is not concatenated BSON documents.
    """
    blob = doc.get("records")
    if blob is None:
        return [_model_fields(RequestRecord, doc)]
    if not isinstance(blob, bytes | bytearray):
        raise ValueError(f"records is a {type(blob).__name__}, not BSON binary")
    try:
        return bson.decode_all(bytes(blob), _FEED_CODEC)
    except bson.errors.BSONError as exc:
        raise ValueError(f"records is not a sequence of BSON documents: {exc}") from exc
