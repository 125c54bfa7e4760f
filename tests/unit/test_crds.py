"""The generated CRDs: in sync with the models, structural, and as strict as pydantic.

The API server's checks are reproduced in-process (null pruning, defaulting,
the OpenAPI schema with a draft-4 validator — OpenAPI v3.0 uses draft-4
`exclusiveMinimum: true` — and the CEL rules with a CEL interpreter) so that
every invalid manifest in `crd_cases` is shown to be rejected by both pydantic
and the CRD, by the mechanism the case names. The cluster tier applies the
same manifests to a real kube-apiserver.
"""

from __future__ import annotations

import copy
import shutil
from pathlib import Path
from typing import Any

import celpy
import jsonschema_rs
import pytest
import yaml
from celpy.adapter import json_to_cel
from pydantic import BaseModel, ValidationError

from lmedge.api import EdgeNodeSpec, LMServiceSpec
from lmedge.api.crds import all_crds, write_crds
from lmedge.api.manifests import parse_resources
from lmedge.errors import ManifestError
from tests.unit.api.crd_cases import BAD_NAMES, EDGENODE, INVALID, LMSERVICE, TOKEN_LMSERVICE, Case

REPO = Path(__file__).resolve().parents[2]
KINDS = {"LMService": "lmedge.io_lmservices.yaml", "EdgeNode": "lmedge.io_edgenodes.yaml"}
MODELS: dict[str, type[BaseModel]] = {"LMService": LMServiceSpec, "EdgeNode": EdgeNodeSpec}


def root_schema(kind: str) -> dict[str, Any]:
    version = all_crds()[KINDS[kind]]["spec"]["versions"][0]
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


def test_committed_crds_are_in_sync_with_the_models() -> None:
    stale = write_crds(REPO / "crds", check=True)
    assert stale == [], f"run `lmedge crds`: {[str(p) for p in stale]} out of date"


def test_write_and_check(tmp_path: Path) -> None:
    out = tmp_path / "crds"
    assert sorted(p.name for p in write_crds(out, check=True)) == sorted(KINDS.values())
    assert not out.exists(), "check must write nothing"
    written = write_crds(out)
    assert sorted(p.name for p in written) == sorted(KINDS.values())
    for p in written:
        assert p.read_text() == (REPO / "crds" / p.name).read_text()
    assert write_crds(out, check=True) == []
    (out / KINDS["EdgeNode"]).write_text("# edited by hand\n")
    assert write_crds(out, check=True) == [out / KINDS["EdgeNode"]]
    (out / KINDS["LMService"]).unlink()
    assert len(write_crds(out, check=True)) == 2


def test_generation_is_deterministic(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    write_crds(a)
    write_crds(b)
    for name in KINDS.values():
        assert (a / name).read_bytes() == (b / name).read_bytes()


def test_cli_check_fails_on_stale_files(tmp_path: Path) -> None:
    from lmedge.cli import main

    shutil.copytree(REPO / "crds", tmp_path / "crds")
    main(["crds", "--check", "--out", str(tmp_path / "crds")])  # in sync: returns
    (tmp_path / "crds" / KINDS["LMService"]).write_text("stale\n")
    with pytest.raises(SystemExit) as exc:
        main(["crds", "--check", "--out", str(tmp_path / "crds")])
    assert exc.value.code == 1


@pytest.mark.parametrize(
    ("kind", "plural", "short", "scope"),
    [("LMService", "lmservices", "lms", "Namespaced"), ("EdgeNode", "edgenodes", "en", "Cluster")],
    ids=["lmservice", "edgenode"],
)
def test_crd_identity(kind: str, plural: str, short: str, scope: str) -> None:
    doc = yaml.safe_load((REPO / "crds" / KINDS[kind]).read_text())
    spec = doc["spec"]
    assert doc["metadata"]["name"] == f"{plural}.lmedge.io"
    assert (spec["group"], spec["scope"]) == ("lmedge.io", scope)
    assert spec["names"]["kind"] == kind
    assert spec["names"]["plural"] == plural
    assert spec["names"]["shortNames"] == [short]
    (version,) = spec["versions"]
    assert (version["name"], version["served"], version["storage"]) == ("v1alpha1", True, True)
    assert version["subresources"] == {"status": {}}


_ALLOWED = {
    "type",
    "description",
    "properties",
    "required",
    "items",
    "additionalProperties",
    "enum",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "minLength",
    "maxLength",
    "pattern",
    "minItems",
    "maxItems",
    "format",
    "default",
}


def _walk(node: dict[str, Any], path: str) -> list[tuple[str, dict[str, Any]]]:
    out = [(path, node)]
    for k, v in node.get("properties", {}).items():
        out += _walk(v, f"{path}.{k}")
    if isinstance(node.get("items"), dict):
        out += _walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        out += _walk(node["additionalProperties"], f"{path}.*")
    return out


@pytest.mark.parametrize("kind", list(KINDS), ids=str.lower)
def test_schema_is_structural(kind: str) -> None:
    for path, node in _walk(root_schema(kind), "root"):
        unknown = {k for k in node if not k.startswith("x-kubernetes-")} - _ALLOWED
        assert not unknown, f"{path}: keywords a structural schema must not have: {unknown}"
        assert "type" in node or node.get("x-kubernetes-preserve-unknown-fields"), (
            f"{path}: no type"
        )
        assert not ("properties" in node and "additionalProperties" in node), path
        assert node.get("additionalProperties", {}) is not False, path
        for bound in ("exclusiveMinimum", "exclusiveMaximum"):
            assert node.get(bound, True) is True, f"{path}: OpenAPI v3.0 {bound} is a boolean"
        missing = set(node.get("required", [])) - set(node.get("properties", {}))
        assert not missing, f"{path}: required but not a property: {missing}"
        if "default" in node:
            errors = [
                e.message for e in jsonschema_rs.Draft4Validator(node).iter_errors(node["default"])
            ]
            assert not errors, f"{path}: default does not validate: {errors}"
        if node.get("x-kubernetes-list-type") == "map":
            item = node["items"]
            for key in node["x-kubernetes-list-map-keys"]:
                assert key in item["required"] or "default" in item["properties"][key], path


@pytest.mark.parametrize("kind", list(KINDS), ids=str.lower)
def test_metadata_restricts_only_the_name(kind: str) -> None:
    assert set(root_schema(kind)["properties"]["metadata"]["properties"]) == {"name"}


@pytest.mark.parametrize(
    ("kind", "columns"),
    [
        ("LMService", ["Model", "Modality", "Runs-On", "Active", "Success", "Latency", "Age"]),
        ("EdgeNode", ["Role", "CPU", "Memory", "GPUs", "vGPUs", "Site", "Age"]),
    ],
    ids=["lmservice", "edgenode"],
)
def test_printer_columns_point_at_schema_fields(kind: str, columns: list[str]) -> None:
    version = all_crds()[KINDS[kind]]["spec"]["versions"][0]
    cols = version["additionalPrinterColumns"]
    assert [c["name"] for c in cols] == columns
    schema = root_schema(kind)
    for c in cols:
        node = schema
        for part in c["jsonPath"].lstrip(".").split("."):
            node = node["properties"][part] if part != "creationTimestamp" else {"type": "string"}
        expected = {"date": "string"}.get(c["type"], c["type"])
        assert node["type"] == expected, c


# --- the API server's checks, in-process --------------------------------------------


def _prune_nulls_and_default(node: dict[str, Any], value: Any) -> Any:
    """Drop nulls of non-nullable fields, then fill defaults (apiextensions order)."""
    if isinstance(value, dict) and "properties" in node:
        value = {k: v for k, v in value.items() if v is not None}
        for k, sub in node["properties"].items():
            if k not in value and "default" in sub:
                value[k] = copy.deepcopy(sub["default"])
            if k in value:
                value[k] = _prune_nulls_and_default(sub, value[k])
    elif isinstance(value, list) and "items" in node:
        value = [_prune_nulls_and_default(node["items"], v) for v in value]
    return value


def _unknown_fields(node: dict[str, Any], value: Any, path: str) -> list[str]:
    out: list[str] = []
    if isinstance(value, dict) and "properties" in node:
        for k, v in value.items():
            if k not in node["properties"]:
                out.append(f"{path}.{k}")
            else:
                out += _unknown_fields(node["properties"][k], v, f"{path}.{k}")
    elif isinstance(value, list) and "items" in node:
        for i, v in enumerate(value):
            out += _unknown_fields(node["items"], v, f"{path}[{i}]")
    return out


def _duplicate_map_keys(node: dict[str, Any], value: Any) -> bool:
    if isinstance(value, dict) and "properties" in node:
        return any(
            _duplicate_map_keys(node["properties"][k], v)
            for k, v in value.items()
            if k in node["properties"]
        )
    if isinstance(value, list) and "items" in node:
        if node.get("x-kubernetes-list-type") == "map":
            keys = [tuple(v.get(k) for k in node["x-kubernetes-list-map-keys"]) for v in value]
            if len(keys) != len(set(keys)):
                return True
        return any(_duplicate_map_keys(node["items"], v) for v in value)
    return False


def _cel_failures(node: dict[str, Any], value: dict[str, Any]) -> list[str]:
    env = celpy.Environment()
    failed = []
    for rule in node.get("x-kubernetes-validations", []):
        program = env.program(env.compile(rule["rule"]))
        if not program.evaluate({"self": json_to_cel(value)}):
            failed.append(rule["message"])
    return failed


def api_server_rejections(kind: str, spec: dict[str, Any]) -> dict[str, list[str]]:
    """Every mechanism by which the CRD rejects `spec`, with its messages."""
    node = root_schema(kind)["properties"]["spec"]
    out: dict[str, list[str]] = {}
    unknown = _unknown_fields(node, spec, "spec")
    if unknown:
        out["unknown-field"] = unknown
    value = _prune_nulls_and_default(node, spec)
    if _duplicate_map_keys(node, value):
        out["list-map"] = ["duplicate key"]
    errors = [e.message for e in jsonschema_rs.Draft4Validator(node).iter_errors(value)]
    if errors:
        out["schema"] = errors
    else:
        failed = _cel_failures(node, value)
        if failed:
            out["cel"] = failed
    return out


def _examples() -> list[tuple[str, str, dict[str, Any]]]:
    docs = []
    for f in sorted((REPO / "examples").rglob("*.yaml")):
        for d in yaml.safe_load_all(f.read_text()):
            if isinstance(d, dict) and d.get("kind") in KINDS:
                docs.append((f"{f.name}:{d['metadata']['name']}", d["kind"], d["spec"]))
    return docs


EXAMPLES = _examples()


@pytest.mark.parametrize(
    ("kind", "spec"), [(k, s) for _, k, s in EXAMPLES], ids=[i for i, _, _ in EXAMPLES]
)
def test_example_manifests_pass_the_crd(kind: str, spec: dict[str, Any]) -> None:
    assert api_server_rejections(kind, spec) == {}


def test_there_are_examples_of_both_kinds() -> None:
    assert {k for _, k, _ in EXAMPLES} == set(KINDS)


@pytest.mark.parametrize(
    ("kind", "spec"),
    [("LMService", LMSERVICE), ("LMService", TOKEN_LMSERVICE), ("EdgeNode", EDGENODE)],
    ids=["lmservice", "lmservice-tokens", "edgenode"],
)
def test_base_specs_are_valid(kind: str, spec: dict[str, Any]) -> None:
    MODELS[kind].model_validate(spec)
    assert api_server_rejections(kind, spec) == {}


@pytest.mark.parametrize("case", INVALID, ids=[c.id for c in INVALID])
def test_invalid_spec_is_rejected_by_pydantic_and_the_crd(case: Case) -> None:
    with pytest.raises(ValidationError):
        MODELS[case.kind].model_validate(case.spec())
    rejections = api_server_rejections(case.kind, case.spec())
    assert case.how in rejections, f"expected {case.how}, CRD says {rejections or 'valid'}"


def test_the_invalid_cases_cover_every_mechanism() -> None:
    assert len(INVALID) >= 20
    assert {c.how for c in INVALID} == {"schema", "cel", "list-map", "unknown-field"}
    rules = {
        r["message"]
        for kind in KINDS
        for r in root_schema(kind)["properties"]["spec"].get("x-kubernetes-validations", [])
    }
    hit = {
        m for c in INVALID if c.how == "cel" for m in api_server_rejections(c.kind, c.spec())["cel"]
    }
    assert hit == rules, "every CEL rule needs an invalid case"


def test_gpu_only_service_needs_no_cpu_profile() -> None:
    spec = {**LMSERVICE, "runsOn": "gpu-only", "profile": {"gpuSecondsPerPrompt": 9.9}}
    LMServiceSpec.model_validate(spec)
    assert api_server_rejections("LMService", spec) == {}


@pytest.mark.parametrize("name", BAD_NAMES)
def test_bad_names_are_rejected_by_the_loader_and_the_crd(name: str) -> None:
    for kind in KINDS:
        doc = {"apiVersion": "lmedge.io/v1alpha1", "kind": kind, "metadata": {"name": name}}
        doc["spec"] = LMSERVICE if kind == "LMService" else EDGENODE
        with pytest.raises(ManifestError, match=r"metadata\.name"):
            parse_resources([("bad.yaml", doc)])
        name_schema = root_schema(kind)["properties"]["metadata"]["properties"]["name"]
        assert not jsonschema_rs.Draft4Validator(name_schema).is_valid(name)


def _status_problems(kind: str, status: dict[str, Any]) -> list[str]:
    node = root_schema(kind)["properties"]["status"]
    errors = [e.message for e in jsonschema_rs.Draft4Validator(node).iter_errors(status)]
    return errors + [f"pruned: {p}" for p in _unknown_fields(node, status, "status")]


def test_operator_status_fits_the_status_schemas() -> None:
    """What the operator patches into status must survive: no schema error, no pruning."""
    from lmedge.backends.kubernetes.pods import ObservedPod
    from lmedge.operator.logic import ServiceStats, edge_node_status, lmservice_status

    spec = EdgeNodeSpec.model_validate(EDGENODE)
    for problems in ([], ["spec.cpuCores=16 but the Node allocates 8 CPU"]):
        assert _status_problems("EdgeNode", edge_node_status(spec, problems, 2)) == []
    pods = [
        ObservedPod(name="a", lm="lm1", node="w1", placement_hash="h", phase="Running", ready=True),
        ObservedPod(
            name="b", lm="lm1", node="w2", placement_hash="h", phase="Pending", ready=False
        ),
    ]
    stats = ServiceStats(requests=10, success_ratio=0.6, mean_latency_s=42.0, rejected=2)
    for s in (stats, None):
        assert _status_problems("LMService", lmservice_status(pods, s, 5)) == []
