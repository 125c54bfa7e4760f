"""The offline loader (`lmedge simulate -f DIR`) and the real API server agree.

Every manifest of the corpus below, valid or not, is read by the loader from
a file and sent as the same YAML text to the test kube-apiserver with the
CRDs installed, as `kubectl apply` sends it (server-side dry run, strict field
validation). Both must accept it or both must refuse it: a manifest the
emulator runs must be one a cluster takes, and a typo the cluster refuses
must not be silently dropped or coerced offline. Each case also states the
verdict it was written for, so a corpus mistake shows as such.
"""

from __future__ import annotations

import copy
import ssl
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import httpx
import pytest
import yaml

from lmedge.api.manifests import load_resources
from lmedge.errors import ManifestError
from tests.fixtures.cluster import KubeCluster
from tests.unit.api.crd_cases import EDGENODE, LMSERVICE, TOKEN_LMSERVICE, _set

Kind = Literal["LMService", "EdgeNode"]


@dataclass(frozen=True)
class Manifest:
    id: str
    kind: Kind
    valid: bool
    text: str


def _yaml(kind: Kind, spec: dict[str, Any], **top: Any) -> str:
    doc = {
        "apiVersion": top.pop("apiVersion", "lmedge.io/v1alpha1"),
        "kind": top.pop("kind_", kind),
        "metadata": top.pop("metadata", {"name": "NAME"}),
        "spec": spec,
        **top,
    }
    return yaml.safe_dump(doc, sort_keys=False)


def _lms(edit: Callable[[dict[str, Any]], None] | None = None, **top: Any) -> str:
    spec = copy.deepcopy(LMSERVICE)
    if edit:
        edit(spec)
    return _yaml("LMService", spec, **top)


def _tokens(edit: Callable[[dict[str, Any]], None] | None = None) -> str:
    spec = copy.deepcopy(TOKEN_LMSERVICE)
    if edit:
        edit(spec)
    return _yaml("LMService", spec)


def _en(edit: Callable[[dict[str, Any]], None] | None = None, **top: Any) -> str:
    spec = copy.deepcopy(EDGENODE)
    if edit:
        edit(spec)
    return _yaml("EdgeNode", spec, **top)


def _rename(old: str, new: str) -> Callable[[dict[str, Any]], None]:
    return lambda spec: spec.__setitem__(new, spec.pop(old))


def _text(base: str, old: str, new: str) -> str:
    assert old in base, old
    return base.replace(old, new, 1)


LMS = _lms()
EN = _en()

CORPUS: list[Manifest] = [
    # -- valid ---------------------------------------------------------------------
    Manifest("lms-valid", "LMService", True, LMS),
    Manifest("en-valid", "EdgeNode", True, EN),
    Manifest("lms-int-for-a-number", "LMService", True, _lms(_set("minMemoryGib", 1))),
    Manifest(
        "lms-integral-float-for-an-integer",
        "LMService",
        True,
        _text(LMS, "maxVgpus: 2", "maxVgpus: 2.0"),
    ),
    Manifest("lms-null-optional", "LMService", True, _lms(_set("deadlineS", None))),
    # YAML 1.2 core-schema floats: no dot needed, an unsigned exponent (kubectl reads numbers).
    Manifest(
        "lms-exponent-for-a-number",
        "LMService",
        True,
        _text(LMS, "deploymentMemoryGib: 3", "deploymentMemoryGib: 4e0"),
    ),
    Manifest(
        "lms-exponent-for-an-integer", "LMService", True, _text(LMS, "maxVgpus: 2", "maxVgpus: 2e0")
    ),
    Manifest("en-large-exponent", "EdgeNode", True, _text(EN, "cpuCores: 16", "cpuCores: 1.6e1")),
    Manifest(
        "lms-dotted-exponent", "LMService", True, _text(LMS, "minVramGib: 1.0", "minVramGib: 1.5e0")
    ),
    Manifest("lms-null-defaulted", "LMService", True, _lms(_set("minVramGib", None))),
    Manifest(
        "lms-gpu-only-without-cpu-profile",
        "LMService",
        True,
        _lms(lambda s: s.update(runsOn="gpu-only", profile={"gpuSecondsPerPrompt": 9.9})),
    ),
    Manifest("lms-min-cpu", "LMService", True, _lms(_set("minCpuCores", 0.5))),
    Manifest(
        "lms-date-like-model-name",
        "LMService",
        True,
        _text(LMS, "model: gpt2", "model: 2024-01-01"),
    ),
    Manifest(
        "lms-anchor-and-alias",
        "LMService",
        True,
        _text(LMS, "minVramGib: 1.0", "minVramGib: &v 1.0\n  quality: *v"),
    ),
    Manifest(
        "en-labels-and-annotations",
        "EdgeNode",
        True,
        _en(
            metadata={
                "name": "NAME",
                "labels": {"lmedge.io/site": "uob", "tier": "edge_1"},
                "annotations": {"example.org/note": "any text, even spaces"},
            }
        ),
    ),
    Manifest(
        "en-explicit-defaults",
        "EdgeNode",
        True,
        _en(lambda s: s.update(role="worker", vgpusPerGpu=2)),
    ),
    # -- token engines -----------------------------------------------------------------
    Manifest("lms-token-engine", "LMService", True, _tokens()),
    Manifest("lms-token-integral-numbers", "LMService", True, _tokens(_set("minVramGib", 6))),
    Manifest(
        "lms-token-decode-in-any-order",
        "LMService",
        True,
        _tokens(lambda s: s["engine"]["tokens"]["cpu"]["decode"].reverse()),
    ),
    Manifest(
        "lms-token-explicit-pipeline",
        "LMService",
        True,
        _lms(_set("engine", {"kind": "pipeline"})),
    ),
    Manifest(
        "lms-token-with-a-profile",
        "LMService",
        True,
        _tokens(_set("profile", {"gpuSecondsPerPrompt": 0.5, "cpuSecondsPerPrompt": 4})),
    ),
    Manifest(
        "lms-token-decode-falls",
        "LMService",
        False,
        _tokens(_set("engine.tokens.gpus.0.decode.2.tokensPerS", 500)),
    ),
    Manifest(
        "lms-token-kv-over-vram", "LMService", False, _tokens(_set("engine.tokens.kvCacheGib", 4))
    ),
    Manifest("lms-token-kind-typo", "LMService", False, _tokens(_set("engine.kind", "llamacpp"))),
    Manifest(
        "lms-token-snake-case", "LMService", False, _tokens(_set("engine.tokens.weights_gib", 2))
    ),
    # -- kind and API version ---------------------------------------------------------
    Manifest("kind-typo", "LMService", False, _lms(kind_="LMservice")),
    Manifest("kind-of-another-group", "LMService", False, _lms(kind_="ConfigMap", apiVersion="v1")),
    Manifest("kind-missing", "LMService", False, _text(LMS, "kind: LMService\n", "")),
    Manifest("api-version-typo", "LMService", False, _lms(apiVersion="lmedge.io/v1")),
    Manifest(
        "api-version-missing", "EdgeNode", False, _text(EN, "apiVersion: lmedge.io/v1alpha1\n", "")
    ),
    # -- field names --------------------------------------------------------------------
    Manifest(
        "snake-case-required-field",
        "LMService",
        False,
        _lms(_rename("deploymentMemoryGib", "deployment_memory_gib")),
    ),
    Manifest(
        "snake-case-optional-field", "LMService", False, _lms(_rename("minVramGib", "min_vram_gib"))
    ),
    Manifest("snake-case-nested-field", "EdgeNode", False, _en(_set("gpus.0", {"vram_gib": 24}))),
    Manifest("unknown-top-level-field", "LMService", False, _lms(specs={"model": "gpt2"})),
    Manifest(
        "unknown-metadata-field", "EdgeNode", False, _en(metadata={"name": "NAME", "nmae": "x"})
    ),
    Manifest("spec-missing", "EdgeNode", False, _text(EN, "spec:", "status:")),
    # -- types and coercion -------------------------------------------------------------
    Manifest("quoted-number", "LMService", False, _lms(_set("deploymentMemoryGib", "3"))),
    Manifest("quoted-integer", "LMService", False, _lms(_set("maxVgpus", "2"))),
    Manifest("quoted-nested-number", "EdgeNode", False, _en(_set("links.0.latencyMs", "2"))),
    Manifest("bool-for-a-number", "EdgeNode", False, _en(_set("cpuCores", True))),
    Manifest("number-for-a-string", "LMService", False, _lms(_set("image", 12))),
    Manifest("image-with-space", "LMService", False, _lms(_set("image", "ghcr.io/x/y:1 sh"))),
    Manifest("exponent-for-a-string", "LMService", False, _text(LMS, "model: gpt2", "model: 1e9")),
    Manifest("yes-for-a-string", "EdgeNode", False, _text(EN, "site: uob", "site: yes")),
    Manifest("fraction-for-an-integer", "EdgeNode", False, _en(_set("vgpusPerGpu", 1.5))),
    Manifest("spec-is-a-list", "LMService", False, _yaml("LMService", [])),  # type: ignore[arg-type]
    Manifest("min-cpu-below-1m", "LMService", False, _lms(_set("minCpuCores", 0.0001))),
    Manifest("min-cpu-above-default", "LMService", False, _lms(_set("minCpuCores", 8))),
    # -- numbers JSON cannot hold -------------------------------------------------------
    Manifest(
        "inf", "LMService", False, _text(LMS, "deploymentMemoryGib: 3", "deploymentMemoryGib: .inf")
    ),
    Manifest("nan", "LMService", False, _text(LMS, "minVramGib: 1.0", "minVramGib: .nan")),
    Manifest(
        "negative-inf-nested", "EdgeNode", False, _text(EN, "latencyMs: 2", "latencyMs: -.inf")
    ),
    # -- duplicate keys ---------------------------------------------------------------
    Manifest(
        "duplicate-spec-key",
        "LMService",
        False,
        _text(LMS, "  model: gpt2\n", "  model: gpt2\n  model: gpt2\n"),
    ),
    Manifest(
        "duplicate-top-level-key",
        "EdgeNode",
        False,
        _text(EN, "kind: EdgeNode\n", "kind: EdgeNode\nkind: EdgeNode\n"),
    ),
    Manifest(
        "duplicate-key-in-a-list-item",
        "EdgeNode",
        False,
        _text(EN, "latencyMs: 2\n", "latencyMs: 2\n    latencyMs: 3\n"),
    ),
    # -- metadata ---------------------------------------------------------------------
    Manifest("name-uppercase", "EdgeNode", False, _en(metadata={"name": "Worker-NAME"})),
    Manifest(
        "label-value-with-space",
        "EdgeNode",
        False,
        _en(metadata={"name": "NAME", "labels": {"tier": "edge one"}}),
    ),
    Manifest(
        "label-key-invalid",
        "LMService",
        False,
        _lms(metadata={"name": "NAME", "labels": {"-tier": "a"}}),
    ),
    Manifest(
        "annotation-not-a-string",
        "LMService",
        False,
        _lms(metadata={"name": "NAME", "annotations": {"example.org/n": 3}}),
    ),
]


def test_the_corpus_is_large_and_mixed() -> None:
    assert len(CORPUS) >= 30
    assert sum(m.valid for m in CORPUS) >= 10 and sum(not m.valid for m in CORPUS) >= 20
    assert len({m.id for m in CORPUS}) == len(CORPUS)


def _named(m: Manifest) -> tuple[str, str]:
    name = f"c{uuid.uuid4().hex[:6]}-{m.id}"[:63].rstrip("-")
    return name, m.text.replace("NAME", name)


def loader_accepts(text: str, tmp_path: Path) -> tuple[bool, str]:
    f = tmp_path / "manifest.yaml"
    f.write_text(text)
    try:
        nodes, services = load_resources(f)
    except ManifestError as exc:
        message = str(exc)
        assert "\n" not in message and message.startswith(f"{f}: "), message
        return False, message
    assert len(nodes) + len(services) == 1
    return True, ""


@pytest.fixture(scope="module")
def apiserver(lmedge_cluster: KubeCluster) -> Iterator[tuple[httpx.Client, str]]:
    namespace = lmedge_cluster.create_namespace(f"loader-{uuid.uuid4().hex[:6]}")
    tls = ssl.create_default_context(cafile=str(lmedge_cluster.ca_file))
    with httpx.Client(
        base_url=lmedge_cluster.server,
        verify=tls,
        headers={"Authorization": f"Bearer {lmedge_cluster.token}"},
        timeout=60,
    ) as http:
        yield http, namespace


def apiserver_accepts(
    http: httpx.Client, namespace: str, kind: Kind, text: str
) -> tuple[bool, str]:
    """POST the YAML as kubectl apply would (dry run, strict field validation)."""
    base = "/apis/lmedge.io/v1alpha1"
    path = (
        f"{base}/namespaces/{namespace}/lmservices" if kind == "LMService" else f"{base}/edgenodes"
    )
    response = http.post(
        path,
        params={"dryRun": "All", "fieldValidation": "Strict"},
        content=text.encode(),
        headers={"Content-Type": "application/yaml"},
    )
    assert response.status_code < 500, response.text
    if response.status_code < 300:
        return True, ""
    return False, str(response.json().get("message", response.text))


@pytest.mark.parametrize("manifest", CORPUS, ids=[m.id for m in CORPUS])
def test_loader_and_apiserver_agree(
    apiserver: tuple[httpx.Client, str], manifest: Manifest, tmp_path: Path
) -> None:
    http, namespace = apiserver
    _, text = _named(manifest)
    by_loader, loader_says = loader_accepts(text, tmp_path)
    by_server, server_says = apiserver_accepts(http, namespace, manifest.kind, text)
    assert by_loader == by_server, (
        f"loader: {loader_says or 'accepted'}; API server: {server_says or 'accepted'}"
    )
    assert by_server == manifest.valid, server_says or "accepted"
