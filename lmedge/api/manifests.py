"""Reading `LMService` / `EdgeNode` manifests: the YAML a user `kubectl apply`s.

The emulator builds its cluster from exactly these files, so one set of
manifests describes both worlds. Every problem becomes a `ManifestError`
naming the file, the object and the field.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from lmedge.api.base import K8sName
from lmedge.api.observations import NodeInfo, ServiceInfo
from lmedge.api.resources import API_GROUP, API_VERSION, EdgeNodeSpec, LMServiceSpec
from lmedge.errors import ManifestError

API = f"{API_GROUP}/{API_VERSION}"
KINDS = ("LMService", "EdgeNode")
_NAME = K8sName.__metadata__[0].pattern  # type: ignore[attr-defined]


def format_validation_error(exc: ValidationError, prefix: str = "") -> tuple[str, str]:
    """(field path, message) of the first pydantic error, as a person reads it."""
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"])
    path = f"{prefix}.{loc}" if prefix and loc else (prefix or loc)
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        msg = "unknown field"
    elif err["type"] == "missing":
        msg = "required field is missing"
    more = len(exc.errors()) - 1
    return path, msg + (f" (and {more} more)" if more else "")


def read_documents(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """All YAML documents in a file or in the *.yaml files of a folder (sorted)."""
    files = sorted(path.glob("*.y*ml")) if path.is_dir() else [path]
    if not path.exists():
        raise ManifestError(str(path), "", "no such file or folder")
    docs: list[tuple[str, dict[str, Any]]] = []
    for f in files:
        try:
            loaded = list(yaml.safe_load_all(f.read_text()))
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f"line {mark.line + 1}" if mark else ""
            problem = getattr(exc, "problem", None) or str(exc)
            # One line: pyyaml's own message spans several, with a source excerpt.
            raise ManifestError(
                str(f), where, f"not valid YAML: {' '.join(problem.split())}"
            ) from exc
        for d in loaded:
            if d is None:
                continue
            if not isinstance(d, dict):
                raise ManifestError(str(f), "", "each YAML document must be a mapping")
            docs.append((str(f), d))
    return docs


def parse_resources(
    docs: Iterable[tuple[str, dict[str, Any]]],
) -> tuple[list[NodeInfo], list[ServiceInfo]]:
    """EdgeNodes and LMServices from parsed documents; other kinds are skipped."""
    nodes: list[NodeInfo] = []
    services: list[ServiceInfo] = []
    first_seen: dict[tuple[str, str], str] = {}
    for source, d in docs:
        kind = d.get("kind")
        if kind not in KINDS:
            continue
        if d.get("apiVersion") != API:
            raise ManifestError(
                source, "apiVersion", f"expected {API!r}, got {d.get('apiVersion')!r}"
            )
        meta = d.get("metadata")
        name = meta.get("name") if isinstance(meta, dict) else None
        if not isinstance(name, str) or not _valid_name(name):
            raise ManifestError(
                source, f"{kind}.metadata.name", "must be a lowercase RFC 1123 name (a-z, 0-9, -)"
            )
        if (kind, name) in first_seen:
            # Name the file of the second definition: that is the one to fix or remove.
            raise ManifestError(
                source, f"{kind}/{name}", f"defined twice (first in {first_seen[(kind, name)]})"
            )
        first_seen[(kind, name)] = source
        model = EdgeNodeSpec if kind == "EdgeNode" else LMServiceSpec
        try:
            spec = model.model_validate(d.get("spec") or {})
        except ValidationError as exc:
            field, msg = format_validation_error(exc, f"{kind}/{name}.spec")
            raise ManifestError(source, field, msg) from exc
        if isinstance(spec, EdgeNodeSpec):
            nodes.append(NodeInfo(name=name, spec=spec))
        else:
            services.append(ServiceInfo(name=name, spec=spec))
    return nodes, services


def load_resources(path: Path) -> tuple[list[NodeInfo], list[ServiceInfo]]:
    return parse_resources(read_documents(path))


def _valid_name(name: str) -> bool:
    import re

    return len(name) <= 63 and re.fullmatch(_NAME, name) is not None


def to_manifest(kind: str, name: str, spec: LMServiceSpec | EdgeNodeSpec) -> dict[str, Any]:
    """The manifest dict a user would apply for `spec`."""
    return {
        "apiVersion": API,
        "kind": kind,
        "metadata": {"name": name},
        "spec": spec.model_dump(by_alias=True, exclude_none=True, mode="json"),
    }
