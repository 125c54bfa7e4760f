"""The `LMService` and `EdgeNode` CustomResourceDefinitions, generated from the
pydantic specs (`lmedge crds` writes them into `crds/`).

pydantic's JSON Schema (draft 2020-12) becomes a Kubernetes *structural*
OpenAPI v3 schema: `$ref`s inlined, `Optional[X]` turned into a non-required
X (a null is pruned by the API server, as pydantic treats it as absent),
`exclusiveMinimum: n` into `minimum: n, exclusiveMinimum: true`, and the
keywords Kubernetes forbids or ignores (`title`, `examples`,
`additionalProperties: false`) dropped. A keyword the converter does not know
is an error, so a model change that needs a new mapping fails the generator
instead of silently weakening the CRD.

Unknown fields cannot be rejected by a structural schema: the API server
prunes them, and rejects them only under strict field validation (kubectl's
default since 1.25). The cross-field checks pydantic does in
`model_validator`s are repeated as CEL rules (`CEL_RULES`), next to each other
here so a reader can compare them; `tests/unit/test_crds.py` checks that
every rule rejects what pydantic rejects.

Status schemas come from the `*Status` models below, which the operator fills.
"""

from __future__ import annotations

import copy
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, Field

from lmedge.api.base import K8sName, SpecModel
from lmedge.api.engines import GpuThroughputProfile, ThroughputProfile, TokenProfile
from lmedge.api.resources import API_GROUP, API_VERSION, EdgeNodeSpec, LMServiceSpec

_NAME_RULES = K8sName.__metadata__[0]  # type: ignore[attr-defined]


class Condition(SpecModel):
    """A standard Kubernetes status condition."""

    type: str = Field(min_length=1, max_length=316, description="Condition type, e.g. Ready.")
    status: Literal["True", "False", "Unknown"]
    reason: str = Field(default="", max_length=1024, description="CamelCase reason.")
    message: str = Field(default="", max_length=32768, description="Human-readable details.")
    last_transition_time: datetime | None = Field(
        default=None, description="When the status last changed."
    )
    observed_generation: int | None = Field(default=None, ge=0)


class LMServiceStatus(SpecModel):
    """What the operator reports about one LM service."""

    observed_generation: int | None = Field(default=None, ge=0)
    active_instances: int | None = Field(
        default=None, ge=0, description="Ready model pods over all nodes."
    )
    instances_per_node: dict[str, int] | None = Field(
        default=None, description="Ready model pods per node name."
    )
    success_ratio: float | None = Field(
        default=None, ge=0, le=1, description="Successful / all requests, recent window."
    )
    rejected_ratio: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="Requests refused at once by admission control / all; failures.",
    )
    mean_latency_seconds: float | None = Field(
        default=None, ge=0, description="Mean end-to-end latency of successful requests."
    )
    window_seconds: int | None = Field(
        default=None, ge=0, description="The window of successRatio and meanLatencySeconds."
    )
    conditions: list[Condition] | None = Field(
        default=None,
        description="Valid, Ready (an instance serves), Degraded (it serves badly), "
        "Unschedulable (nothing serves it and no up worker has room: the message says what "
        "is missing).",
    )


class EdgeNodeStatus(SpecModel):
    """What the operator reports about one edge node."""

    observed_generation: int | None = Field(default=None, ge=0)
    gpus: int | None = Field(default=None, ge=0, description="Physical GPUs in the spec.")
    vgpus: int | None = Field(default=None, ge=0, description="GPUs x time-slicing replicas.")
    conditions: list[Condition] | None = Field(
        default=None,
        description="CapacityMatches: the spec fits the Node's allocatable resources; "
        "NodeReady: the Node is Ready and not cordoned (else the node is left out of routing "
        "and planning).",
    )


Rule = dict[str, str]

# The token engine's rules sit on `spec` (where the in-process checker and the
# API server's messages both point), guarded by has() down to engine.tokens.
_TOKENS = "!has(self.engine) || !has(self.engine.tokens) || "
_T = "self.engine.tokens"
_CURVE = (
    "{c}.decode.exists(p, p.running == 1) && {c}.decode.all(a, {c}.decode.all(b, "
    "a.running >= b.running || (double(a.tokensPerS) <= double(b.tokensPerS) && "
    "double(a.tokensPerS) * double(b.running) >= double(b.tokensPerS) * double(a.running))))"
)


def _pool(held: str) -> str:
    """CEL: the KV pool within `held` GiB (see `lmedge.api.engines.kv_pool_gib`)."""
    given = f"double({_T}.kvCacheGib)"
    return f"(has({_T}.kvCacheGib) ? {given} : double({held}) - double({_T}.weightsGib))"


def _on_gpu_and_cpu(check: str) -> str:
    """CEL: `check` (with {held}) for minVramGib, and deploymentMemoryGib on cpu-or-gpu."""
    gpu = check.format(held="self.minVramGib")
    cpu = check.format(held="self.deploymentMemoryGib")
    return f"{gpu} && (self.runsOn != 'cpu-or-gpu' || {cpu})"


#: CEL rules on `spec`, each the twin of a pydantic `model_validator` check.
CEL_RULES: dict[type[BaseModel], list[Rule]] = {
    LMServiceSpec: [
        {
            "rule": "self.minMemoryGib <= self.deploymentMemoryGib",
            "message": "minMemoryGib must not exceed deploymentMemoryGib",
        },
        {
            "rule": "self.minCpuCores <= self.defaultCpuCores",
            "message": "minCpuCores must not exceed defaultCpuCores",
        },
        {
            "rule": "self.runsOn != 'cpu-or-gpu' || !has(self.profile) "
            "|| has(self.profile.cpuSecondsPerPrompt)",
            "message": "a cpu-or-gpu service needs profile.cpuSecondsPerPrompt",
        },
        {
            "rule": "has(self.profile) || (has(self.engine) && self.engine.kind != 'pipeline')",
            "message": "a pipeline engine needs profile (seconds per prompt)",
        },
        {
            "rule": "!has(self.engine) "
            "|| (self.engine.kind == 'pipeline') != has(self.engine.tokens)",
            "message": "llama.cpp and vllm engines need engine.tokens; pipeline has none",
        },
        {
            "rule": _TOKENS + f"self.runsOn != 'cpu-or-gpu' || has({_T}.cpu)",
            "message": "a cpu-or-gpu service with a token engine needs engine.tokens.cpu",
        },
        {
            "rule": _TOKENS
            + f"{_T}.gpus.all(g, {_CURVE.format(c='g')}) && "
            + f"(!has({_T}.cpu) || {_CURVE.format(c=_T + '.cpu')})",
            "message": "decode needs a point with running 1, tokensPerS must not fall and "
            "tokensPerS per sequence must not rise as running grows",
        },
        {
            "rule": _TOKENS
            + f"!has({_T}.kvCacheGib) || "
            + _on_gpu_and_cpu(
                f"double({_T}.weightsGib) + double({_T}.kvCacheGib) <= double({{held}})"
            ),
            "message": "engine.tokens: weightsGib + kvCacheGib must not exceed minVramGib "
            "(nor deploymentMemoryGib on cpu-or-gpu)",
        },
        {
            "rule": _TOKENS
            + _on_gpu_and_cpu(
                f"double({_T}.contextTokens) * double({_T}.kvBytesPerToken) "
                f"<= {_pool('{held}')} * 1073741824.0"
            ),
            "message": "engine.tokens: the KV pool must hold one contextTokens sequence",
        },
    ],
    EdgeNodeSpec: [
        # Duplicate sites are rejected by `x-kubernetes-list-type: map` on links.
        {
            "rule": "!has(self.links) || self.links.all(l, l.site != self.site)",
            "message": "links must not include the node's own site",
        },
    ],
}

#: Lists whose items are keyed (the API server rejects duplicate keys).
LIST_MAP_KEYS: dict[tuple[type[BaseModel], str], list[str]] = {
    (EdgeNodeSpec, "links"): ["site"],
    (TokenProfile, "gpus"): ["gpuModel"],
    (ThroughputProfile, "decode"): ["running"],
    (GpuThroughputProfile, "decode"): ["running"],
    (LMServiceStatus, "conditions"): ["type"],
    (EdgeNodeStatus, "conditions"): ["type"],
}

_KEEP = {
    "type",
    "description",
    "enum",
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "pattern",
    "minItems",
    "maxItems",
    "format",
    "default",
    "required",
}
_DROP = {"title", "examples"}


class _Converter:
    """JSON Schema (pydantic) -> structural OpenAPI v3, see the module docstring."""

    def __init__(self, schema: dict[str, Any]) -> None:
        self.defs: dict[str, Any] = schema.get("$defs", {})

    def convert(self, node: dict[str, Any], where: str) -> dict[str, Any]:
        node = dict(node)
        if "anyOf" in node:
            node = self._optional(node, where)
        model = ""
        if "$ref" in node:
            model = node.pop("$ref").removeprefix("#/$defs/")
            node = {**self.defs[model], **node}  # the field's own description wins
        out: dict[str, Any] = {}
        for key, value in node.items():
            if key in _DROP or key == "$defs":
                continue
            if key == "additionalProperties":
                if isinstance(value, dict):
                    out[key] = self.convert(value, f"{where}.*")
                continue  # `false`: unknown fields are pruned by the API server
            if key == "properties":
                out[key] = {k: self.convert(v, f"{where}.{k}") for k, v in value.items()}
            elif key == "items":
                out[key] = self.convert(value, f"{where}[]")
            elif key in ("exclusiveMinimum", "exclusiveMaximum"):
                out["minimum" if key == "exclusiveMinimum" else "maximum"] = value
                out[key] = True
            elif key == "const":
                out["enum"] = [value]
            elif key in _KEEP:
                out[key] = copy.deepcopy(value)
            else:
                raise ValueError(f"{where}: no CRD mapping for JSON Schema keyword {key!r}")
        if out.get("default", 0) is None:
            del out["default"]
        if "type" not in out:
            raise ValueError(f"{where}: a structural schema needs a type")
        _list_map_keys(out, model)
        return out

    def _optional(self, node: dict[str, Any], where: str) -> dict[str, Any]:
        options = node.pop("anyOf")
        rest = [o for o in options if o != {"type": "null"}]
        if len(rest) != 1 or len(options) != 2:
            raise ValueError(f"{where}: only Optional[X] unions map to a CRD schema")
        return {**rest[0], **node}


def _list_map_keys(out: dict[str, Any], model: str) -> None:
    """Mark the keyed lists of the model named `model` (LIST_MAP_KEYS)."""
    for (owner, field), keys in LIST_MAP_KEYS.items():
        if owner.__name__ == model:
            alias = owner.model_fields[field].alias or field
            out["properties"][alias]["x-kubernetes-list-type"] = "map"
            out["properties"][alias]["x-kubernetes-list-map-keys"] = list(keys)


def openapi_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The structural OpenAPI v3 schema of a model, with its CEL rules and list keys."""
    schema = model.model_json_schema(by_alias=True, mode="validation")
    out = _Converter(schema).convert(schema, model.__name__)
    if model in CEL_RULES:
        out["x-kubernetes-validations"] = [dict(r) for r in CEL_RULES[model]]
    _list_map_keys(out, model.__name__)
    return out


def _status_schema(model: type[BaseModel]) -> dict[str, Any]:
    out = openapi_schema(model)
    # kopf keeps handler progress in status.kopf when annotations cannot hold it.
    out["properties"]["kopf"] = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    return out


def _columns(*cols: tuple[str, str, str, str]) -> list[dict[str, Any]]:
    return [
        {"name": name, "type": kind, "jsonPath": path, "description": text}
        for name, kind, path, text in cols
    ] + [{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}]


_LMSERVICE_COLUMNS = _columns(
    ("Model", "string", ".spec.model", "Model id."),
    ("Modality", "string", ".spec.modality", "Input-to-output modality."),
    ("Runs-On", "string", ".spec.runsOn", "gpu-only or cpu-or-gpu."),
    ("Active", "integer", ".status.activeInstances", "Ready model pods."),
    ("Success", "number", ".status.successRatio", "Recent success ratio."),
    ("Latency", "number", ".status.meanLatencySeconds", "Mean latency of successes, s."),
)
_EDGENODE_COLUMNS = _columns(
    ("Role", "string", ".spec.role", "worker or control."),
    ("CPU", "number", ".spec.cpuCores", "Allocatable CPU cores."),
    ("Memory", "number", ".spec.memoryGib", "Allocatable memory, GiB."),
    ("GPUs", "integer", ".status.gpus", "Physical GPUs."),
    ("vGPUs", "integer", ".status.vgpus", "Time-sliced vGPUs."),
    ("Site", "string", ".spec.site", "Location."),
)


def crd(
    kind: str,
    plural: str,
    short: str,
    scope: Literal["Namespaced", "Cluster"],
    spec_model: type[BaseModel],
    status_model: type[BaseModel],
    columns: list[dict[str, Any]],
) -> dict[str, Any]:
    """One CustomResourceDefinition (apiextensions.k8s.io/v1) as a dict."""
    root = {
        "type": "object",
        "description": (spec_model.__doc__ or kind).strip().splitlines()[0],
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {
                "type": "object",
                "properties": {
                    "name": {
                        "type": "string",
                        "maxLength": _NAME_RULES.max_length,
                        "pattern": _NAME_RULES.pattern,
                    }
                },
            },
            "spec": openapi_schema(spec_model),
            "status": _status_schema(status_model),
        },
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{plural}.{API_GROUP}",
            "annotations": {"lmedge.io/generated-by": "lmedge crds (from lmedge.api)"},
            "labels": {"app.kubernetes.io/part-of": "lmedge"},
        },
        "spec": {
            "group": API_GROUP,
            "scope": scope,
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": kind.lower(),
                "shortNames": [short],
                "categories": ["lmedge"],
            },
            "versions": [
                {
                    "name": API_VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": root},
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": columns,
                }
            ],
        },
    }


def all_crds() -> dict[str, dict[str, Any]]:
    """File name -> CRD for every lmedge custom resource."""
    return {
        f"{API_GROUP}_lmservices.yaml": crd(
            "LMService",
            "lmservices",
            "lms",
            "Namespaced",
            LMServiceSpec,
            LMServiceStatus,
            _LMSERVICE_COLUMNS,
        ),
        f"{API_GROUP}_edgenodes.yaml": crd(
            "EdgeNode",
            "edgenodes",
            "en",
            "Cluster",
            EdgeNodeSpec,
            EdgeNodeStatus,
            _EDGENODE_COLUMNS,
        ),
    }


class _Dumper(yaml.SafeDumper):
    """Block style for multi-line strings (docstrings read as written)."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)

_HEADER = "# Generated by `lmedge crds` from lmedge/api; do not edit by hand.\n"


def render(doc: dict[str, Any]) -> str:
    """Deterministic YAML: keys sorted, no line wrapping."""
    body = yaml.dump(doc, Dumper=_Dumper, sort_keys=True, width=10_000, allow_unicode=True)
    return _HEADER + "---\n" + body


def write_crds(out: Path, check: bool = False) -> list[Path]:
    """Write every CRD into `out`; return the files written.

    With `check=True` nothing is written and the files that are missing or
    differ from what the models generate are returned instead (empty: in sync).
    """
    changed: list[Path] = []
    for name, doc in sorted(all_crds().items()):
        path = out / name
        text = render(doc)
        if check:
            if not path.is_file() or path.read_text() != text:
                changed.append(path)
            continue
        out.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        changed.append(path)
    return changed
