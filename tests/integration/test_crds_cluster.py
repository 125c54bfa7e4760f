"""The generated CRDs on a real kube-apiserver: the examples apply, every
invalid manifest of the shared corpus is rejected with a message naming what
is wrong, and the printer columns and short names are served.
"""

from __future__ import annotations

import json
import ssl
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.fixtures.cluster import REPO, KubeCluster
from tests.unit.api.crd_cases import BAD_NAMES, EDGENODE, INVALID, LMSERVICE, Case

GROUP, VERSION = "lmedge.io", "v1alpha1"
EXAMPLES = sorted(p for p in (REPO / "examples").iterdir() if (p / "services.yaml").is_file())


@pytest.fixture(scope="module")
def custom(lmedge_cluster: KubeCluster) -> Iterator[client.CustomObjectsApi]:
    with lmedge_cluster.api_client() as api:
        yield client.CustomObjectsApi(api)


@pytest.fixture(scope="module")
def namespace(lmedge_cluster: KubeCluster) -> str:
    return lmedge_cluster.create_namespace(f"crds-{uuid.uuid4().hex[:6]}")


def create(
    custom: client.CustomObjectsApi, obj: dict[str, Any], namespace: str, dry_run: bool = True
) -> Any:
    """Create `obj` as kubectl would (strict field validation); dry-run by default."""
    kw: dict[str, Any] = {"field_validation": "Strict"}
    if dry_run:
        kw["dry_run"] = "All"
    if obj["kind"] == "LMService":
        return custom.create_namespaced_custom_object(
            GROUP, VERSION, namespace, "lmservices", obj, **kw
        )
    return custom.create_cluster_custom_object(GROUP, VERSION, "edgenodes", obj, **kw)


def rejection(
    custom: client.CustomObjectsApi, obj: dict[str, Any], namespace: str
) -> tuple[int, str]:
    with pytest.raises(ApiException) as err:
        create(custom, obj, namespace)
    return err.value.status, json.loads(err.value.body)["message"]


def changed_path(base: Any, edited: Any, path: str = "spec") -> str:
    """The first path where `edited` differs from `base`, as the API server writes it."""
    if isinstance(base, dict) and isinstance(edited, dict):
        for key in [*base, *(k for k in edited if k not in base)]:
            if base.get(key, ...) != edited.get(key, ...):
                return changed_path(base.get(key), edited.get(key), f"{path}.{key}")
    if isinstance(base, list) and isinstance(edited, list) and len(base) == len(edited):
        for i, (a, b) in enumerate(zip(base, edited, strict=True)):
            if a != b:
                return changed_path(a, b, f"{path}[{i}]")
    return path


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_examples_are_accepted(
    custom: client.CustomObjectsApi, namespace: str, example: Path
) -> None:
    # the manifests the scenario names (examples/lyreo keeps one nodes file per mix)
    scenario = yaml.safe_load((example / "scenario.yaml").read_text())
    docs = [
        d
        for name in (scenario.get("nodes", "nodes.yaml"), scenario.get("services", "services.yaml"))
        for d in yaml.safe_load_all((example / name).read_text())
        if d
    ]

    for doc in docs:
        # The testbed's EdgeNodes exist already (cluster-scoped); dry-run them renamed.
        doc["metadata"]["name"] = f"ex-{doc['metadata']['name']}"[:63].rstrip("-")
        create(custom, doc, namespace)

    assert {d["kind"] for d in docs} == {"EdgeNode", "LMService"}


def test_corpus_is_large_enough() -> None:
    assert len(INVALID) >= 20


@pytest.mark.parametrize("case", INVALID, ids=[c.id for c in INVALID])
def test_invalid_manifest_is_rejected_with_a_clear_message(
    custom: client.CustomObjectsApi, namespace: str, case: Case
) -> None:
    status, message = rejection(custom, case.manifest(), namespace)

    path = changed_path(case.valid_spec(), case.spec())
    if case.how == "unknown-field":
        assert status == 400
        assert f'unknown field "{path}' in message
        return
    assert status == 422
    assert message.startswith(f'{case.kind}.{GROUP} "bad-{case.id}" is invalid'), message
    if case.how == "cel":
        # The rule's own sentence, not "some rules were not checked".
        assert "spec: Invalid value: " in message
        assert "were not checked" not in message
        assert len(message.split("spec: Invalid value: ", 1)[1]) > 20
    elif case.how == "list-map":
        # The duplicate is reported at the list item, with the key that repeats.
        item, key = path.rsplit(".", 1)
        assert f"{item}: Duplicate value: " in message
        assert key in message
    else:
        assert path in message, (path, message)


@pytest.mark.parametrize("name", BAD_NAMES)
@pytest.mark.parametrize("kind", ["LMService", "EdgeNode"])
def test_bad_names_are_rejected(
    custom: client.CustomObjectsApi, namespace: str, kind: str, name: str
) -> None:
    obj = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": kind,
        "metadata": {"name": name},
        "spec": LMSERVICE if kind == "LMService" else EDGENODE,
    }

    status, message = rejection(custom, obj, namespace)

    assert status == 422
    assert "metadata.name" in message


def table(cluster: KubeCluster, path: str) -> dict[str, Any]:
    """GET `path` as a server-side table (what kubectl get prints)."""
    req = urllib.request.Request(
        cluster.server + path,
        headers={
            "Authorization": f"Bearer {cluster.token}",
            "Accept": "application/json;as=Table;v=v1;g=meta.k8s.io",
        },
    )
    ctx = ssl.create_default_context(cafile=str(cluster.ca_file))
    with urllib.request.urlopen(req, context=ctx, timeout=10) as resp:
        out: dict[str, Any] = json.load(resp)
    return out


def test_printer_columns_and_short_names(
    lmedge_cluster: KubeCluster, custom: client.CustomObjectsApi, namespace: str
) -> None:
    services = [
        d for d in yaml.safe_load_all((REPO / "examples/testbed/services.yaml").read_text()) if d
    ]
    for doc in services:
        create(custom, doc, namespace, dry_run=False)

    lms = table(lmedge_cluster, f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/lmservices")
    ens = table(lmedge_cluster, f"/apis/{GROUP}/{VERSION}/edgenodes")

    assert [c["name"] for c in lms["columnDefinitions"]][:5] == [
        "Name", "Model", "Modality", "Runs-On", "Active",
    ]  # fmt: skip
    assert sorted(r["cells"][0] for r in lms["rows"]) == ["lm1", "lm2", "lm3", "lm4"]
    assert {"Role", "CPU", "GPUs", "vGPUs"} <= {c["name"] for c in ens["columnDefinitions"]}
    with lmedge_cluster.api_client() as api:
        resources = client.CustomObjectsApi(api).get_api_resources(GROUP, VERSION).resources
    short = {r.name: r.short_names for r in resources if "/" not in r.name}
    assert short == {"lmservices": ["lms"], "edgenodes": ["en"]}
