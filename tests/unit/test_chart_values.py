"""The Helm chart's static parts, checked without Helm: its CRDs are the ones
`lmedge crds` generates, its values file documents every value, and its
values schema accepts the defaults and matches the values' shape."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema_rs
import pytest
import yaml

from lmedge.api.crds import write_crds

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "lmedge"


def test_chart_crds_match_the_generated_ones(tmp_path: Path) -> None:
    # The chart ships copies (Helm installs only what is inside the chart);
    # `lmedge crds -o charts/lmedge/crds` rewrites them.
    assert write_crds(CHART / "crds", check=True) == []
    generated = {p.name: p.read_text() for p in (REPO / "crds").glob("*.yaml")}
    shipped = {p.name: p.read_text() for p in (CHART / "crds").glob("*.yaml")}
    assert shipped == generated


def test_crd_check_notices_a_stale_copy(tmp_path: Path) -> None:
    for path in (CHART / "crds").glob("*.yaml"):
        (tmp_path / path.name).write_text(path.read_text().replace("v1alpha1", "v1alpha0", 1))
    assert len(write_crds(tmp_path, check=True)) == 2


def _values() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text())
    return loaded


def _leaf_paths(node: Any, prefix: str = "") -> list[str]:
    if isinstance(node, dict) and node and not prefix.endswith(("resources", "Selector")):
        return [p for k, v in node.items() for p in _leaf_paths(v, f"{prefix}.{k}".lstrip("."))]
    return [prefix]


def test_every_value_has_a_comment_with_an_example() -> None:
    # Each key of values.yaml is preceded by a comment block containing
    # "Example" (docs/design.md "Conventions"). A map parent may go without
    # one when each of its keys has its own; the keys of a documented leaf map
    # (resources: {requests, limits}) are covered by their parent's example.
    lines = (CHART / "values.yaml").read_text().splitlines()
    missing = []
    documented_at: dict[int, bool] = {}  # indent -> that parent's comment had an example
    for i, line in enumerate(lines):
        match = re.match(r"^(\s*)([A-Za-z][\w]*):", line)
        if not match:
            continue
        indent = len(match.group(1))
        block = []
        j = i - 1
        while j >= 0 and lines[j].strip().startswith("#"):
            block.append(lines[j])
            j -= 1
        has_example = any("Example" in c for c in block)
        covered = any(ok for level, ok in documented_at.items() if level < indent)
        documented_at = {k: v for k, v in documented_at.items() if k < indent}
        documented_at[indent] = has_example
        is_map_parent = line.rstrip().endswith(":")
        if not (has_example or covered or is_map_parent):
            missing.append(line.strip())
    assert missing == []


def test_schema_accepts_the_defaults_and_knows_every_value() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    validator = jsonschema_rs.validator_for(schema)
    values = _values()
    validator.validate(values)

    def known(path: str) -> bool:
        node = schema
        for key in path.split("."):
            props = node.get("properties", {})
            if key not in props:
                return (
                    node.get("type") == "object" and node.get("additionalProperties") is not False
                )
            node = props[key]
        return True

    assert [p for p in _leaf_paths(values) if not known(p)] == []


@pytest.mark.parametrize(
    ("patch", "where"),
    [
        ({"loop": {"lambda": 1.5}}, "lambda"),
        ({"loop": {"slotSeconds": 0}}, "slotSeconds"),
        ({"mongodb": {"image": "mongo:latest"}}, "image"),
        ({"image": {"pullPolicy": "Sometimes"}}, "pullPolicy"),
        ({"workloadNamespace": "Not_A_Namespace"}, "workloadNamespace"),
        ({"timeSlicing": {"replicas": [2, 2]}}, "replicas"),
        ({"gatway": {}}, "gatway"),
        ({"policy": {"profile": "mma"}}, "mma"),
        ({"policy": {"deployer": "agentic-deployer"}}, "agentic-deployer"),
        ({"monitoring": {"prometheusRule": {"silentSlots": 0}}}, "silentSlots"),
    ],
)
def test_schema_rejects_bad_values(patch: dict[str, Any], where: str) -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = _values()
    for key, value in patch.items():
        if isinstance(value, dict) and isinstance(values.get(key), dict):
            values[key] = {**values[key], **value}
        else:
            values[key] = value
    errors = list(jsonschema_rs.validator_for(schema).iter_errors(values))
    assert errors
    assert any(where in str(e) for e in errors), [str(e) for e in errors]


def _catalog() -> dict[str, list[str]]:
    from lmedge.controller import catalog

    return {
        "profile": sorted(catalog.PROFILES),
        "planner": ["", *sorted(catalog.PLANNERS)],
        "router": ["", *sorted(catalog.ROUTERS)],
        "deployer": ["", *sorted(catalog.DEPLOYERS)],
    }


def test_schema_knows_exactly_the_registered_profiles_and_plugins() -> None:
    # `helm install --set policy.profile=typo` must fail at install, not in a
    # crash-looping controller; and a new plugin must be installable.
    schema = json.loads((CHART / "values.schema.json").read_text())
    policy = schema["properties"]["policy"]["properties"]
    assert {k: policy[k]["enum"] for k in ("profile", "planner", "router", "deployer")} == (
        _catalog()
    )


def test_policy_examples_in_values_name_real_plugins() -> None:
    known = _catalog()
    text = (CHART / "values.yaml").read_text()
    for tier in ("profile", "planner", "router", "deployer"):
        for name in re.findall(rf"Example: {tier}: ([\w-]+)", text):
            assert name in known[tier], f"values.yaml example {tier}: {name} does not exist"
