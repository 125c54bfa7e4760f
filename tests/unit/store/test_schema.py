"""pydantic JSON Schema -> MongoDB `$jsonSchema` conversion.

A small evaluator of the `$jsonSchema` subset the converter emits serves as the
oracle: documents pydantic dumps must pass it, and documents MongoDB should
reject (wrong type, missing field, unknown field, out of range) must fail it.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any, Literal

import pytest
from pydantic import BaseModel, ConfigDict, Field

from lmedge.api.decisions import Decision, MacroPolicy, Placement, RoutingMap
from lmedge.api.observations import MemoryCase
from lmedge.api.records import NodeTelemetry, RequestRecord
from lmedge.api.totals import LoadBalanceStats, RunTotals, WindowTotals
from lmedge.store.documents import COLLECTIONS, FEED, RunInfo, feed_documents, to_document
from lmedge.store.schema import bson_schema, to_bson_schema

_PY_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "int": (int,),
    "long": (int,),
    "double": (float,),
    "decimal": (float,),
    "bool": (bool,),
    "object": (dict,),
    "array": (list,),
    "null": (type(None),),
    "date": (datetime,),
    "binData": (bytes,),
}


def _is_bson_type(value: Any, name: str) -> bool:
    if isinstance(value, bool):
        return name == "bool"
    return isinstance(value, _PY_TYPES[name])


def violations(schema: dict[str, Any], value: Any, path: str = "$") -> list[str]:
    """Why `value` fails `schema` (empty when it passes)."""
    out: list[str] = []
    if "bsonType" in schema:
        names = schema["bsonType"] if isinstance(schema["bsonType"], list) else [schema["bsonType"]]
        if not any(_is_bson_type(value, n) for n in names):
            return [f"{path}: {type(value).__name__} is not {names}"]
    if "enum" in schema and value not in schema["enum"]:
        out.append(f"{path}: {value!r} not in enum")
    if isinstance(value, int | float) and not isinstance(value, bool):
        if "minimum" in schema:
            low = schema["minimum"]
            if value < low or (schema.get("exclusiveMinimum") and value == low):
                out.append(f"{path}: below minimum")
        if "maximum" in schema:
            high = schema["maximum"]
            if value > high or (schema.get("exclusiveMaximum") and value == high):
                out.append(f"{path}: above maximum")
    if isinstance(value, str):
        if "pattern" in schema and not re.search(schema["pattern"], value):
            out.append(f"{path}: pattern")
        if len(value) < schema.get("minLength", 0):
            out.append(f"{path}: too short")
    if isinstance(value, dict):
        out += [f"{path}.{k}: required" for k in schema.get("required", []) if k not in value]
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties", True)
        for key, item in value.items():
            if key in props:
                out += violations(props[key], item, f"{path}.{key}")
            elif extra is False:
                out.append(f"{path}.{key}: not allowed")
            elif isinstance(extra, dict):
                out += violations(extra, item, f"{path}.{key}")
    if isinstance(value, list) and "items" in schema:
        items = schema["items"]
        if isinstance(items, list):
            for i, (sub, item) in enumerate(zip(items, value, strict=False)):
                out += violations(sub, item, f"{path}[{i}]")
            if schema.get("additionalItems") is False and len(value) > len(items):
                out.append(f"{path}: too many items")
        else:
            for i, item in enumerate(value):
                out += violations(items, item, f"{path}[{i}]")
    for key in ("anyOf", "oneOf"):
        if key in schema:
            passing = [s for s in schema[key] if not violations(s, value, path)]
            if not passing or (key == "oneOf" and len(passing) > 1):
                out.append(f"{path}: no {key} branch matches")
    return out


def _keys(node: Any) -> set[str]:
    if isinstance(node, dict):
        return set(node) | {k for v in node.values() for k in _keys(v)}
    if isinstance(node, list):
        return {k for v in node for k in _keys(v)}
    return set()


_NOW = datetime(2025, 1, 2, 3, 4, 5, 600000, tzinfo=UTC)
_MACRO = MacroPolicy.model_validate(
    {
        "routing": [{"lm": "qwen", "weights": [{"node": "a", "p": 0.4}, {"node": "b", "p": 0.6}]}],
        "roles": [{"node": "a", "lms": ["qwen"]}],
        "rationale": "balance",
    }
)
SAMPLES: list[BaseModel] = [
    Decision[MacroPolicy](
        agent="planner",
        policy="agentic",
        source="llm",
        value=_MACRO,
        run="r1",
        epoch=2,
        raw="{}",
        tokens_in=10,
        created_at=_NOW,
    ),
    Decision[RoutingMap](
        agent="scheduler",
        policy="lyapunov",
        source="rule",
        run="r1",
        value=RoutingMap.model_validate(
            {"routes": [{"origin": "a", "lm": "qwen", "destination": "b"}]}
        ),
    ),
    Decision[Placement](
        agent="deployer",
        policy="local",
        source="fallback",
        node="a",
        outcome="replaced",
        violations=["vram"],
        value=Placement.model_validate(
            {"node": "a", "lms": [{"lm": "qwen", "mode": "gpu", "cpu_cores": 2.0, "vgpus": 1}]}
        ),
    ),
    RequestRecord(
        id="q1",
        run="r1",
        lm="qwen",
        origin="a",
        destination="b",
        prompts=4,
        slot=3,
        submit_s=90.5,
        queue_s=1.25,
        outcome="success",
        mode="gpu",
    ),
    NodeTelemetry(
        run="r1",
        node="a",
        time_s=30.0,
        cpu_util=0.5,
        memory_util=0.25,
        gpu_util=[0.1, 0.9],
        extra={"power_w": 31.5},
    ),
    MemoryCase.model_validate(
        {
            "run": "r1",
            "epoch": 1,
            "traffic": {"qwen": 12},
            "policy": _MACRO.model_dump(),
            "objective": None,
            "metrics": {
                "per_lm": [
                    {
                        "lm": "qwen",
                        "arrivals": 3,
                        "successes": 2,
                        "success_ratio": 0.667,
                        "mean_latency_s": None,
                    }
                ],
                "requests": 3,
                "successes": 2,
                "mean_latency_s": 4.5,
                "jain": 1.0,
                "f_norm": None,
                "t_norm": None,
                "objective": None,
            },
        }
    ),
    RunInfo(id="r1", scenario="testbed", policy="MA", seed=7, started=_NOW),
    RunTotals(
        run="r1",
        slots=20,
        balance=LoadBalanceStats(
            slots=20, mean_deviation=0.01, mean_virtual_queue=0.0, high_kv_share=None
        ),
        windows=WindowTotals(windows=3, requests=7, reported=2, j_mean=0.4, cost=0.0),
    ),
]
_COLLECTION_OF = {
    "Decision[MacroPolicy]": "macro_policies",
    "Decision[RoutingMap]": "routing_maps",
    "Decision[Placement]": "deployments",
    "RequestRecord": "requests",
    "NodeTelemetry": "telemetry",
    "MemoryCase": "memory",
    "RunInfo": "runs",
    "RunTotals": "run_totals",
}


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda m: type(m).__name__)
def test_stored_documents_pass_their_collection_validator(sample: BaseModel) -> None:
    spec = COLLECTIONS[_COLLECTION_OF[type(sample).__name__]]
    schema = spec.validator()
    assert violations(schema, to_document(sample)) == []


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda m: type(m).__name__)
def test_validators_use_only_the_mongodb_dialect(sample: BaseModel) -> None:
    schema = COLLECTIONS[_COLLECTION_OF[type(sample).__name__]].validator()
    forbidden = {
        "$ref",
        "$defs",
        "type",
        "format",
        "default",
        "title",
        "const",
        "prefixItems",
        "discriminator",
        "examples",
    }
    assert _keys(schema) & forbidden == set()
    assert schema["bsonType"] == "object"
    assert schema["additionalProperties"] is False  # extra="forbid" carried over


def test_feed_documents_pass_the_feed_validator() -> None:
    schema = COLLECTIONS[FEED].validator()
    (doc,) = feed_documents([to_document(SAMPLES[3])], batch_size=500)
    assert violations(schema, doc) == []
    assert schema["additionalProperties"] is False
    assert violations(schema, {**doc, "records": "not binary"}) != []


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda d: d.pop("lm"), "required"),
        (lambda d: d.update(prompts="four"), "is not"),
        (lambda d: d.update(prompts=-1), "below minimum"),
        (lambda d: d.update(outcome="lost"), "not in enum"),
        (lambda d: d.update(colour="red"), "not allowed"),
        (lambda d: d.update(_id=17), "is not"),
    ],
    ids=["missing", "wrong-type", "out-of-range", "not-in-enum", "unknown-field", "bad-id"],
)
def test_validator_rejects_what_pydantic_rejects(mutate: Any, reason: str) -> None:
    doc = to_document(SAMPLES[3])
    mutate(doc)
    found = violations(COLLECTIONS["requests"].validator(), doc)
    assert any(reason in v for v in found), found


def test_nested_refs_are_inlined_with_their_constraints() -> None:
    schema = bson_schema(Decision[RoutingMap])
    weight = bson_schema(Decision[MacroPolicy])["properties"]["value"]["properties"]["routing"]
    p = weight["items"]["properties"]["weights"]["items"]["properties"]["p"]
    assert p["minimum"] == 0 and p["maximum"] == 1
    assert p["bsonType"] == ["double", "int", "long", "decimal"]
    assert schema["properties"]["value"]["properties"]["routes"]["bsonType"] == "array"


class _Node(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    children: list[_Node] = Field(default_factory=list)


class _Odd(BaseModel):
    kind: Literal["odd"] = "odd"
    ratio: float = Field(gt=0, lt=1)
    pair: tuple[int, str]
    when: datetime
    maybe: int | None = None


def test_recursive_models_stop_at_the_first_repetition() -> None:
    schema = bson_schema(_Node)
    children = schema["properties"]["children"]
    assert children["bsonType"] == "array"
    assert children["items"] == {}  # the inner _Node: anything


def test_draft_2020_keywords_are_rewritten() -> None:
    props = bson_schema(_Odd)["properties"]
    assert props["kind"]["enum"] == ["odd"]
    assert props["ratio"] == {
        "bsonType": ["double", "int", "long", "decimal"],
        "minimum": 0,
        "exclusiveMinimum": True,
        "maximum": 1,
        "exclusiveMaximum": True,
    }
    assert props["pair"]["items"] == [{"bsonType": ["int", "long"]}, {"bsonType": "string"}]
    assert props["pair"]["maxItems"] == 2  # pydantic bounds tuples by length
    assert props["when"] == {"bsonType": "string"}  # stored in JSON form; format dropped
    assert props["maybe"]["anyOf"] == [{"bsonType": ["int", "long"]}, {"bsonType": "null"}]
    odd = _Odd(ratio=0.5, pair=(1, "a"), when=_NOW).model_dump(mode="json")
    assert violations(bson_schema(_Odd), odd) == []
    assert violations(bson_schema(_Odd), {**odd, "ratio": 1.0})


def test_extra_properties_are_added_and_bad_refs_refused() -> None:
    out = to_bson_schema({"type": "object", "properties": {}}, extra_properties={"_id": {}})
    assert out["properties"] == {"_id": {}}
    with pytest.raises(ValueError, match="unsupported JSON Schema reference"):
        to_bson_schema({"$ref": "https://example.com/x.json"})
