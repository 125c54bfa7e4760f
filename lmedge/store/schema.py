"""Translate pydantic JSON Schema into MongoDB's `$jsonSchema` dialect.

Collection validators are generated from the same pydantic models that define the
documents, so a field added to a model is validated by the server with no second
edit. MongoDB implements a draft-4 subset of JSON Schema with its own `bsonType`
keyword; this module rewrites pydantic's (draft 2020-12) output into that subset:

* `$ref` / `$defs` are inlined (MongoDB has no references); a recursive model's
  inner occurrence becomes `{}` (anything), because an inlined cycle never ends;
* `type` becomes `bsonType` (JSON has one number type, BSON has four);
* numeric `exclusiveMinimum: x` becomes `minimum: x, exclusiveMinimum: true`;
* `const` becomes a one-element `enum`, `prefixItems` becomes tuple-form `items`;
* keywords MongoDB rejects (`format`, `default`, `examples`, `title`,
  `discriminator`, ...) are dropped: validation is then looser, never stricter,
  than pydantic's, so a document pydantic accepts is always accepted by the server.

It does not talk to a server; `lmedge.store.backends` decides whether the server
supports validators at all.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

__all__ = ["bson_schema", "to_bson_schema"]

# JSON Schema type -> accepted BSON types. Documents are stored in the model's JSON
# form, where an integral float may come back from a driver as an int, so "number"
# accepts every numeric BSON type.
_BSON_TYPES: dict[str, list[str]] = {
    "string": ["string"],
    "integer": ["int", "long"],
    "number": ["double", "int", "long", "decimal"],
    "boolean": ["bool"],
    "object": ["object"],
    "array": ["array"],
    "null": ["null"],
}

# Keywords copied unchanged when present (MongoDB's documented $jsonSchema subset,
# minus the ones that need rewriting below).
_PASSTHROUGH = frozenset(
    {
        "description",
        "enum",
        "maximum",
        "minimum",
        "maxItems",
        "minItems",
        "maxLength",
        "minLength",
        "maxProperties",
        "minProperties",
        "multipleOf",
        "pattern",
        "required",
        "uniqueItems",
    }
)
# Keywords whose value is a schema, a list of schemas, or a map of schemas.
_SUBSCHEMA = frozenset({"not", "additionalItems", "additionalProperties"})
_SUBSCHEMA_LISTS = frozenset({"allOf", "anyOf", "oneOf"})
_SUBSCHEMA_MAPS = frozenset({"properties", "patternProperties"})


def to_bson_schema(
    json_schema: Mapping[str, Any], *, extra_properties: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Convert one pydantic JSON Schema document into a MongoDB `$jsonSchema`.

    `extra_properties` are added to the top-level `properties` (already in the
    BSON dialect): the store's own fields such as `_id`, which the model does not
    declare but a strict (`additionalProperties: false`) schema must allow.
    """
    defs: Mapping[str, Any] = json_schema.get("$defs", {})
    out = _convert(json_schema, defs, ())
    if extra_properties:
        props = dict(out.get("properties", {}))
        props.update(extra_properties)
        out["properties"] = props
    return out


def bson_schema(
    model: type[BaseModel], *, extra_properties: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The `$jsonSchema` validating `model.model_dump(mode="json")` documents."""
    return to_bson_schema(
        model.model_json_schema(mode="serialization"), extra_properties=extra_properties
    )


def _resolve(ref: str, defs: Mapping[str, Any]) -> tuple[str, Mapping[str, Any]]:
    prefix = "#/$defs/"
    if not ref.startswith(prefix) or ref[len(prefix) :] not in defs:
        raise ValueError(f"unsupported JSON Schema reference {ref!r}")
    name = ref[len(prefix) :]
    return name, defs[name]


def _convert(
    schema: Mapping[str, Any], defs: Mapping[str, Any], stack: tuple[str, ...]
) -> dict[str, Any]:
    if "$ref" in schema:
        name, target = _resolve(schema["$ref"], defs)
        if name in stack:
            return {}  # recursive model: accept anything below the first level
        # Sibling keywords next to $ref (pydantic puts `description` there) apply too.
        merged = {**target, **{k: v for k, v in schema.items() if k != "$ref"}}
        return _convert(merged, defs, (*stack, name))

    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in _PASSTHROUGH:
            out[key] = value
        elif key == "type":
            names = value if isinstance(value, list) else [value]
            bson: list[str] = []
            for name in names:
                for bt in _BSON_TYPES[name]:
                    if bt not in bson:
                        bson.append(bt)
            out["bsonType"] = bson[0] if len(bson) == 1 else bson
        elif key == "const":
            out["enum"] = [value]
        elif key in ("exclusiveMinimum", "exclusiveMaximum"):
            if isinstance(value, bool):  # already draft-4 form
                out[key] = value
            else:
                out["minimum" if key == "exclusiveMinimum" else "maximum"] = value
                out[key] = True
        elif key == "items":
            if isinstance(value, bool):
                # Draft 2020 `items: false` after `prefixItems` means "no more items".
                if not value:
                    out["additionalItems"] = False
            elif isinstance(value, list):
                out["items"] = [_convert(s, defs, stack) for s in value]
            elif "prefixItems" in schema:
                out["additionalItems"] = _convert(value, defs, stack)
            else:
                out["items"] = _convert(value, defs, stack)
        elif key == "prefixItems":
            out["items"] = [_convert(s, defs, stack) for s in value]
        elif key in _SUBSCHEMA:
            out[key] = value if isinstance(value, bool) else _convert(value, defs, stack)
        elif key in _SUBSCHEMA_LISTS:
            out[key] = [_convert(s, defs, stack) for s in value]
        elif key in _SUBSCHEMA_MAPS:
            out[key] = {k: _convert(s, defs, stack) for k, s in value.items()}
        # Anything else (format, default, title, examples, $defs, discriminator,
        # propertyNames, ...) is not understood by MongoDB and is dropped.
    return out
