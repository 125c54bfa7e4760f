"""Decision JSON Schemas: OpenAI strict-mode rules, and round trips."""

from __future__ import annotations

from typing import Any

import jsonschema_rs
import pytest
from pydantic import BaseModel, ValidationError

from lmedge.api import (
    LMPlacement,
    LMRouting,
    MacroPolicy,
    NodeRole,
    Placement,
    Rejection,
    Route,
    RouteWeight,
    RoutingMap,
)
from lmedge.api.schema import DECISION_MODELS, all_decision_schemas, strict_json_schema

SAMPLES: dict[str, BaseModel] = {
    "macro-policy": MacroPolicy(
        routing=[
            LMRouting(
                lm="lm1", weights=[RouteWeight(node="w1", p=0.25), RouteWeight(node="w2", p=0.75)]
            )
        ],
        roles=[NodeRole(node="w1", lms=["lm1"]), NodeRole(node="w2", lms=[])],
        rationale="w2 is idle.",
    ),
    "routing-map": RoutingMap(
        routes=[
            Route(origin="w1", lm="lm1", destination="w2"),
            Route(origin="w2", lm="lm3", destination="w2"),
        ],
        rejections=[Rejection(origin="w1", lm="lm4")],
    ),
    "placement": Placement(
        node="w1",
        lms=[
            LMPlacement(lm="lm1", mode="gpu", cpu_cores=4, vgpus=1),
            LMPlacement(lm="lm2", mode="cpu", cpu_cores=2.5, vgpus=0),
            LMPlacement(lm="lm3", mode="off", cpu_cores=0, vgpus=0),
        ],
    ),
}


def _nodes(node: Any) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if isinstance(node, dict):
        out.append(node)
        for k, v in node.items():
            if k in ("properties", "$defs"):
                for sub in v.values():
                    out += _nodes(sub)
            else:
                out += _nodes(v)
    elif isinstance(node, list):
        for v in node:
            out += _nodes(v)
    return out


def test_every_decision_model_has_a_sample() -> None:
    assert set(SAMPLES) == set(DECISION_MODELS)
    assert set(all_decision_schemas()) == set(DECISION_MODELS)


@pytest.mark.parametrize("name", list(DECISION_MODELS))
def test_strict_schema_follows_openai_strict_rules(name: str) -> None:
    schema = strict_json_schema(DECISION_MODELS[name])
    assert schema["type"] == "object", "the root must be an object"
    assert "anyOf" not in schema, "the root must not be anyOf"
    objects = [n for n in _nodes(schema) if n.get("type") == "object"]
    assert objects
    for obj in objects:
        assert obj.get("additionalProperties") is False, obj
        assert sorted(obj["required"]) == sorted(obj["properties"]), obj
    for node in _nodes(schema):
        assert "default" not in node, f"strict mode rejects defaults: {node}"
        assert "title" not in node or isinstance(node["title"], dict)
        if "$ref" in node:
            assert node["$ref"].removeprefix("#/$defs/") in schema["$defs"]


@pytest.mark.parametrize("name", list(DECISION_MODELS))
def test_strict_schema_keeps_every_field(name: str) -> None:
    schema = strict_json_schema(DECISION_MODELS[name])
    assert set(schema["properties"]) == set(DECISION_MODELS[name].model_fields)


@pytest.mark.parametrize("name", list(DECISION_MODELS))
def test_round_trip_through_the_strict_schema(name: str) -> None:
    model = DECISION_MODELS[name]
    sample = SAMPLES[name]
    payload = sample.model_dump(mode="json")
    validator = jsonschema_rs.Draft202012Validator(strict_json_schema(model))
    assert [e.message for e in validator.iter_errors(payload)] == []
    assert model.model_validate_json(sample.model_dump_json()) == sample
    assert model.model_validate(payload) == sample


@pytest.mark.parametrize(
    ("name", "bad"),
    [
        (
            "placement",
            {"node": "w1", "lms": [{"lm": "x", "mode": "tpu", "cpu_cores": 1, "vgpus": 0}]},
        ),
        ("placement", {"node": "w1", "lms": [{"lm": "x", "mode": "off", "cpu_cores": 0}]}),
        ("routing-map", {"routes": [{"origin": "a", "lm": "b", "destination": "c", "why": "x"}]}),
        ("macro-policy", {"routing": [], "roles": []}),
        (
            "macro-policy",
            {
                "routing": [{"lm": "a", "weights": [{"node": "n", "p": 1.5}]}],
                "roles": [],
                "rationale": "",
            },
        ),
    ],
    ids=["bad-enum", "missing-field", "extra-field", "optional-is-required", "p-above-one"],
)
def test_strict_schema_and_model_reject_the_same(name: str, bad: dict[str, Any]) -> None:
    validator = jsonschema_rs.Draft202012Validator(strict_json_schema(DECISION_MODELS[name]))
    assert not validator.is_valid(bad)
    if name == "macro-policy" and "rationale" not in bad:
        # Strict mode makes every field required; our own parsing keeps the default.
        DECISION_MODELS[name].model_validate(bad)
    else:
        with pytest.raises(ValidationError):
            DECISION_MODELS[name].model_validate(bad)
