"""Manifest loading: every error names the file and the field, in one line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from lmedge.api.manifests import load_resources, to_manifest
from lmedge.errors import ManifestError, UserError
from tests.unit.api.crd_cases import EDGENODE, LMSERVICE

REPO = Path(__file__).resolve().parents[3]


def doc(kind: str, name: str, spec: dict[str, Any] | None = None, **top: Any) -> dict[str, Any]:
    base = LMSERVICE if kind == "LMService" else EDGENODE
    return {
        "apiVersion": "lmedge.io/v1alpha1",
        "kind": kind,
        "metadata": {"name": name},
        "spec": dict(base) if spec is None else spec,
        **top,
    }


def write(path: Path, *docs: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump_all(list(docs), sort_keys=False))
    return path


def test_testbed_loads() -> None:
    nodes, services = load_resources(REPO / "examples" / "testbed")
    assert [n.name for n in nodes] == ["control", *(f"worker-{i}" for i in range(1, 7))]
    assert [s.name for s in services] == ["lm1", "lm2", "lm3", "lm4"]
    assert nodes[0].spec.role == "control"
    assert {s.spec.runs_on for s in services} == {"gpu-only", "cpu-or-gpu"}


def test_empty_documents_and_scenarios_are_skipped(tmp_path: Path) -> None:
    f = tmp_path / "mixed.yaml"
    f.write_text(
        "---\n"
        + yaml.safe_dump(doc("LMService", "lm1"))
        + "---\n"
        + "---\napiVersion: lmedge.io/v1alpha1\nkind: Scenario\nmetadata: {name: x}\n"
    )
    nodes, services = load_resources(f)
    assert (nodes, [s.name for s in services]) == ([], ["lm1"])


def test_other_kinds_are_refused_not_dropped(tmp_path: Path) -> None:
    # A typo in `kind` used to drop the resource without a word.
    f = tmp_path / "mixed.yaml"
    f.write_text(
        yaml.safe_dump(doc("LMService", "lm1"))
        + "---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n"
    )
    with pytest.raises(ManifestError) as exc:
        load_resources(f)
    assert exc.value.field == "document 2: kind"
    assert exc.value.message == "unknown kind 'ConfigMap'; expected one of LMService, EdgeNode"


def test_round_trip_through_to_manifest(tmp_path: Path) -> None:
    nodes, services = load_resources(REPO / "examples" / "testbed")
    docs = [to_manifest("EdgeNode", n.name, n.spec) for n in nodes]
    docs += [to_manifest("LMService", s.name, s.spec) for s in services]
    again = load_resources(write(tmp_path / "all.yaml", *docs))
    assert again == (nodes, services)


Case = tuple[str, str, str, str]  # id, file content, field fragment, message fragment

_LMS = yaml.safe_dump(doc("LMService", "lm1"))

CASES: list[Case] = [
    ("bad-yaml", "kind: LMService\nspec: [unclosed\n", "line ", "not valid YAML"),
    ("not-a-mapping", "- just\n- a list\n", "", "each YAML document must be a mapping"),
    (
        "wrong-api-version",
        _LMS.replace("lmedge.io/v1alpha1", "lmedge.io/v1"),
        "apiVersion",
        "expected 'lmedge.io/v1alpha1', got 'lmedge.io/v1'",
    ),
    (
        "bad-name",
        _LMS.replace("name: lm1", "name: LM_1"),
        "LMService.metadata.name",
        "lowercase RFC 1123",
    ),
    (
        "no-metadata",
        yaml.safe_dump({k: v for k, v in doc("LMService", "x").items() if k != "metadata"}),
        "LMService.metadata.name",
        "RFC 1123",
    ),
    (
        "unknown-field",
        yaml.safe_dump(doc("LMService", "lm1", {**LMSERVICE, "replicas": 2})),
        "LMService/lm1.spec.replicas",
        "unknown field",
    ),
    (
        "missing-field",
        yaml.safe_dump(
            doc("EdgeNode", "w1", {k: v for k, v in EDGENODE.items() if k != "cpuCores"})
        ),
        "EdgeNode/w1.spec.cpuCores",
        "required field is missing",
    ),
    (
        "nested-field",
        yaml.safe_dump(doc("EdgeNode", "w1", {**EDGENODE, "gpus": [{"vramGib": -1}]})),
        "EdgeNode/w1.spec.gpus.0.vramGib",
        "greater than 0",
    ),
    (
        "cross-field",
        yaml.safe_dump(doc("LMService", "lm1", {**LMSERVICE, "minMemoryGib": 10})),
        "LMService/lm1.spec",
        "minMemoryGib (10.0) must not exceed deploymentMemoryGib (3.0)",
    ),
    (
        "empty-spec",
        yaml.safe_dump(doc("LMService", "lm1", spec={})),
        "LMService/lm1.spec.",
        "required field is missing (and ",
    ),
    (
        "duplicate-name",
        _LMS + "---\n" + _LMS,
        "LMService/lm1",
        "defined twice",
    ),
    ("kind-typo", _LMS.replace("kind: LMService", "kind: LMservice"), "document 1: kind",
     "unknown kind 'LMservice'"),
    ("snake-case", _LMS.replace("minVramGib", "min_vram_gib"), "LMService/lm1.spec.min_vram_gib",
     "unknown field"),
    ("quoted-number", _LMS.replace("deploymentMemoryGib: 3", "deploymentMemoryGib: '3'"),
     "LMService/lm1.spec.deploymentMemoryGib", "valid number"),
    ("infinite", _LMS.replace("deploymentMemoryGib: 3", "deploymentMemoryGib: .inf"),
     "document 1: spec.deploymentMemoryGib", "inf is not a JSON number"),
    ("not-a-number", _LMS.replace("minVramGib: 1.0", "minVramGib: .NaN"),
     "document 1: spec.minVramGib", "nan is not a JSON number"),
    ("negative-infinite-in-a-list", yaml.safe_dump(doc("EdgeNode", "w1")).replace(
        "latencyMs: 2", "latencyMs: -.inf"), "document 1: spec.links.0.latencyMs",
     "-inf is not a JSON number"),
    ("image-with-space", _LMS.replace("image: ", "image: 'reg.example/x:1 ", 1).replace(
        ":0.1.0\n", ":0.1.0'\n", 1), "LMService/lm1.spec.image", "should match pattern"),
    ("exponent-for-a-string", _LMS.replace("model: gpt2", "model: 1e9"),
     "LMService/lm1.spec.model", "valid string"),
    ("duplicate-key", _LMS.replace("  model: gpt2\n", "  model: gpt2\n  model: gpt3\n"), "line ",
     "duplicate key 'model'"),
    ("unknown-top-level-field", _LMS + "specs: {}\n", "document 1: LMService/lm1.specs",
     "unknown field"),
    ("second-document", yaml.safe_dump(doc("EdgeNode", "w1")) + "---\n"
     + _LMS.replace("maxVgpus: 2", "maxVgpus: 2.5"), "document 2: LMService/lm1.spec.maxVgpus",
     "valid integer"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("content", "field", "message"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_errors_name_file_and_field(tmp_path: Path, content: str, field: str, message: str) -> None:
    f = tmp_path / "services.yaml"
    f.write_text(content)
    with pytest.raises(ManifestError) as exc:
        load_resources(f)
    err = exc.value
    assert isinstance(err, UserError)
    assert err.source == str(f)
    assert field in err.field
    assert message in err.message
    assert str(err).startswith(f"{f}: ")
    assert "\n" not in str(err)


@pytest.mark.parametrize(
    ("written", "read"),
    [("4e0", 4), ("1e1", 10), ("1.5e0", 1.5), ("+25E-1", 2.5), ("3", 3), ("3.0", 3)],
    ids=["exponent", "exponent-integral", "dotted-exponent", "signed", "integer", "integral-float"],
)
def test_numbers_read_as_yaml_1_2_and_kubectl_read_them(
    tmp_path: Path, written: str, read: float
) -> None:
    f = tmp_path / "services.yaml"
    f.write_text(_LMS.replace("deploymentMemoryGib: 3", f"deploymentMemoryGib: {written}"))

    _, services = load_resources(f)

    assert services[0].spec.deployment_memory_gib == read


def test_missing_path() -> None:
    with pytest.raises(ManifestError, match=r"nowhere\.yaml: no such file or folder"):
        load_resources(Path("/nonexistent/nowhere.yaml"))


def test_folder_is_read_in_name_order(tmp_path: Path) -> None:
    write(tmp_path / "b.yaml", doc("LMService", "second"))
    write(tmp_path / "a.yml", doc("LMService", "first"))
    (tmp_path / "notes.txt").write_text("not yaml: [")
    _, services = load_resources(tmp_path)
    assert [s.name for s in services] == ["first", "second"]


def test_duplicate_across_files_names_the_file_with_the_second_definition(tmp_path: Path) -> None:
    write(tmp_path / "a.yaml", doc("EdgeNode", "w1"), doc("LMService", "lm1"))
    second = write(tmp_path / "b.yaml", doc("LMService", "lm2"), doc("LMService", "lm1"))
    with pytest.raises(ManifestError) as exc:
        load_resources(tmp_path)
    assert (exc.value.source, exc.value.field) == (str(second), "LMService/lm1")
    assert "a.yaml" in exc.value.message  # where the first one is


def test_same_name_for_different_kinds_is_fine(tmp_path: Path) -> None:
    nodes, services = load_resources(
        write(tmp_path / "x.yaml", doc("EdgeNode", "x"), doc("LMService", "x"))
    )
    assert ([n.name for n in nodes], [s.name for s in services]) == (["x"], ["x"])
