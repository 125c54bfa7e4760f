"""JSON Schema export of the decision models, for LLM structured output and docs."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from lmedge.api.decisions import RULE_ONLY, MacroPolicy, Placement, RoutingMap

DECISION_MODELS: dict[str, type[BaseModel]] = {
    "macro-policy": MacroPolicy,
    "routing-map": RoutingMap,
    "placement": Placement,
}


def json_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The model's JSON Schema (draft 2020-12, `$defs` inlined by reference)."""
    return model.model_json_schema(mode="validation")


def strict_json_schema(model: type[BaseModel]) -> dict[str, Any]:
    """A schema valid for OpenAI `response_format: json_schema, strict: true`.

    Strict mode needs every property listed in `required` and
    `additionalProperties: false` on every object; optional fields become
    required (the model's defaults only apply to our own parsing). Fields
    marked `RULE_ONLY` are left out: only deterministic code fills them, and
    a reply without them validates (they have defaults).
    """
    schema = json_schema(model)

    def visit(node: Any) -> None:
        if isinstance(node, dict):
            props = node.get("properties")
            if isinstance(props, dict):
                for name in [
                    k for k, v in props.items() if isinstance(v, dict) and v.get(RULE_ONLY)
                ]:
                    del props[name]
            if node.get("type") == "object" and "properties" in node:
                node["required"] = list(node["properties"])
                node["additionalProperties"] = False
            for key in ("default", "examples", "title"):
                if key in node and not isinstance(node.get(key), dict):
                    node.pop(key, None)
            for v in node.values():
                visit(v)
        elif isinstance(node, list):
            for v in node:
                visit(v)

    visit(schema)
    return schema


def all_decision_schemas() -> dict[str, dict[str, Any]]:
    return {name: json_schema(m) for name, m in DECISION_MODELS.items()}
