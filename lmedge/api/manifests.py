"""Reading `LMService` / `EdgeNode` manifests: the YAML a user `kubectl apply`s.

The emulator builds its cluster from exactly these files, so one set of
manifests describes both worlds, and the loader is exactly as strict as the
API server with the CRDs installed and kubectl's strict field validation:

- YAML as the API server reads it: a duplicate key is an error, timestamps
  stay text, a number in exponent form (`1e9`, `4e0`) is a number as in YAML
  1.2, and a non-finite number (`.inf`, `.nan`) is refused with its field
  named (JSON has none; the API server refuses it in its YAML-to-JSON step,
  naming no field); a null value is dropped, as the API server prunes it;
- only `LMService` and `EdgeNode` of `lmedge.io/v1alpha1` (a `Scenario`
  document is skipped: `lmedge.sim.scenario` reads it); any other kind or
  API version is an error, never silently dropped;
- only the fields the CRD knows, by their camelCase names (a snake_case name
  is an unknown field), at the top level, in `metadata` and in `spec`;
- no coercion: a quoted number is a string, not a number (an integral number
  such as `2.0` is an integer, as the API server takes it).

Every problem becomes one `ManifestError` line naming the file, the document
(1-based, counting non-empty documents) and the field.
"""

from __future__ import annotations

import math
import re
from collections.abc import Hashable, Iterable
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
#: Kinds of lmedge.io that other loaders read; skipped here.
OTHER_KINDS = ("Scenario",)
_NAME = K8sName.__metadata__[0].pattern  # type: ignore[attr-defined]
#: Top-level fields of a custom resource.
_TOP_FIELDS = ("apiVersion", "kind", "metadata", "spec", "status")
#: ObjectMeta fields (a manifest exported with kubectl may carry any of them).
_META_FIELDS = (
    "name", "generateName", "namespace", "labels", "annotations", "uid", "resourceVersion",
    "generation", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds",
    "finalizers", "ownerReferences", "managedFields", "selfLink",
)  # fmt: skip
_LABEL_NAME = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


class _ApiServerLoader(yaml.SafeLoader):
    """PyYAML's safe loader, made to read YAML as the API server does.

    Duplicate keys are an error (the API server's strict decoding refuses
    them; PyYAML keeps the last one), and timestamps are not resolved (the
    API server's YAML-to-JSON step keeps them as strings).
    """

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Hashable, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, Hashable) and key in seen:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping",
                    node.start_mark,
                    f"duplicate key {key!r}",
                    key_node.start_mark,
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def load_yaml(text: str) -> list[Any]:
    """Every document of a YAML text, read as the API server reads YAML (`yaml.YAMLError`).

    Read by libyaml when PyYAML has it (a 1,000-node manifest in about a
    second instead of twenty); a text it refuses is read again by the
    pure-Python parser, so what is accepted and every error message are the
    pure-Python loader's.
    """
    if _FastLoader is not _ApiServerLoader:
        try:
            return list(yaml.load_all(text, Loader=_FastLoader))
        except yaml.YAMLError:
            pass
    return list(yaml.load_all(text, Loader=_ApiServerLoader))


_ApiServerLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
# YAML 1.2 core-schema floats, which the API server's YAML reader (and kubectl's)
# resolves: `1e9`, `4e0`, `1.5e3` are numbers, while PyYAML's YAML 1.1 floats
# need a dot and a signed exponent and leave them as strings. Checked after
# PyYAML's own resolvers, so an integer stays an integer.
_ApiServerLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$"),
    list("-+.0123456789"),
)

_FastLoader: type[Any] = _ApiServerLoader
if getattr(yaml, "__with_libyaml__", False):
    # libyaml scans and parses; resolving and constructing (the duplicate-key
    # check, the resolvers above) stay the Python loader's own.
    class _LibyamlLoader(yaml.CSafeLoader, _ApiServerLoader):
        def __init__(self, stream: str) -> None:
            yaml.CSafeLoader.__init__(self, stream)

    _FastLoader = _LibyamlLoader


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
    try:
        if not path.exists():
            raise ManifestError(str(path), "", "no such file or folder")
        files = sorted(path.glob("*.y*ml")) if path.is_dir() else [path]
    except OSError as exc:  # a name too long, a folder that cannot be listed
        raise ManifestError(str(path)[:200], "", exc.strerror or str(exc)) from exc
    docs: list[tuple[str, dict[str, Any]]] = []
    for f in files:
        try:
            text = f.read_text()
        except OSError as exc:
            raise ManifestError(str(f), "", f"cannot read: {exc.strerror or exc}") from exc
        except UnicodeDecodeError as exc:
            raise ManifestError(str(f), "", f"not UTF-8 text: {exc.reason}") from exc
        try:
            loaded = load_yaml(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f"line {mark.line + 1}" if mark else ""
            problem = getattr(exc, "problem", None) or str(exc)
            # One line: pyyaml's own message spans several, with a source excerpt.
            raise ManifestError(
                str(f), where, f"not valid YAML: {' '.join(problem.split())}"
            ) from exc
        n = 0
        for d in loaded:
            if d is None:
                continue
            n += 1
            if not isinstance(d, dict):
                raise ManifestError(str(f), f"document {n}", "each YAML document must be a mapping")
            docs.append((str(f), d))
    return docs


def parse_resources(
    docs: Iterable[tuple[str, dict[str, Any]]],
) -> tuple[list[NodeInfo], list[ServiceInfo]]:
    """EdgeNodes and LMServices from parsed documents; `Scenario` documents are skipped.

    Anything else is a `ManifestError`: an unknown kind or API version, an
    unknown field, a wrong type, or a value the CRD refuses.
    """
    nodes: list[NodeInfo] = []
    services: list[ServiceInfo] = []
    first_seen: dict[tuple[str, str], str] = {}
    numbers: dict[str, int] = {}
    for source, raw in docs:
        numbers[source] = numbers.get(source, 0) + 1
        where = f"document {numbers[source]}"
        d = as_the_api_server_reads(raw, source, where)
        kind, api_version = d.get("kind"), d.get("apiVersion")
        if api_version == API and kind in OTHER_KINDS:
            continue
        if kind not in KINDS:
            raise ManifestError(
                source,
                f"{where}: kind",
                f"unknown kind {kind!r}; expected one of {', '.join(KINDS)}",
            )
        if api_version != API:
            raise ManifestError(
                source, f"{where}: {kind}.apiVersion", f"expected {API!r}, got {api_version!r}"
            )
        name = _check_metadata(d.get("metadata"), kind, source, where)
        unknown = [k for k in d if k not in _TOP_FIELDS]
        if unknown:
            raise ManifestError(source, f"{where}: {kind}/{name}.{unknown[0]}", "unknown field")
        if (kind, name) in first_seen:
            # Name the file of the second definition: that is the one to fix or remove.
            raise ManifestError(
                source, f"{kind}/{name}", f"defined twice (first in {first_seen[(kind, name)]})"
            )
        first_seen[(kind, name)] = source
        if "spec" not in d:
            raise ManifestError(source, f"{where}: {kind}/{name}.spec", "required field is missing")
        model = EdgeNodeSpec if kind == "EdgeNode" else LMServiceSpec
        try:
            # Strict: no string-to-number coercion; by alias: the wire (camelCase) names only.
            spec = model.model_validate(d["spec"], strict=True, by_alias=True, by_name=False)
        except ValidationError as exc:
            field, msg = format_validation_error(exc, f"{kind}/{name}.spec")
            raise ManifestError(source, f"{where}: {field}", msg) from exc
        if isinstance(spec, EdgeNodeSpec):
            nodes.append(NodeInfo(name=name, spec=spec))
        else:
            services.append(ServiceInfo(name=name, spec=spec))
    return nodes, services


def as_the_api_server_reads(value: Any, source: str, where: str) -> Any:
    """`value` as JSON the API server would store: nulls dropped, integral numbers
    as integers; a non-finite number or a non-string key is a `ManifestError`
    whose field is `where` followed by the path (`document 2: spec.cpuCores`;
    `where` ending in a dot joins without a colon: `Scenario.loop.tauS`)."""

    def field(path: str) -> str:
        return f"{where}{path}" if where.endswith(".") else f"{where}: {path}"

    def walk(v: Any, path: str) -> Any:
        if isinstance(v, dict):
            out: dict[str, Any] = {}
            for k, item in v.items():
                if not isinstance(k, str):
                    raise ManifestError(
                        source, field(path or "(root)"), f"key {k!r} is not a string"
                    )
                if item is not None:
                    out[k] = walk(item, f"{path}.{k}" if path else k)
            return out
        if isinstance(v, list):
            return [walk(item, f"{path}.{i}") for i, item in enumerate(v)]
        if isinstance(v, float):
            if not math.isfinite(v):
                raise ManifestError(source, field(path), f"{v} is not a JSON number")
            if v.is_integer() and abs(v) < 2**63:
                return int(v)
        return v

    return walk(value, "")


def _check_metadata(meta: Any, kind: str, source: str, where: str) -> str:
    """The object's name, after checking metadata as the API server would."""
    if not isinstance(meta, dict):
        raise ManifestError(
            source,
            f"{where}: {kind}.metadata.name",
            "must be a lowercase RFC 1123 name (a-z, 0-9, -)",
        )
    name = meta.get("name")
    if not isinstance(name, str) or not _valid_name(name):
        raise ManifestError(
            source,
            f"{where}: {kind}.metadata.name",
            "must be a lowercase RFC 1123 name (a-z, 0-9, -)",
        )
    path = f"{where}: {kind}/{name}.metadata"
    unknown = [k for k in meta if k not in _META_FIELDS]
    if unknown:
        raise ManifestError(source, f"{path}.{unknown[0]}", "unknown field")
    namespace = meta.get("namespace")
    if namespace is not None and (not isinstance(namespace, str) or not _valid_name(namespace)):
        raise ManifestError(source, f"{path}.namespace", "must be a lowercase RFC 1123 name")
    for field in ("labels", "annotations"):
        entries = meta.get(field, {})
        if not isinstance(entries, dict):
            raise ManifestError(source, f"{path}.{field}", "must be a map of strings")
        for key, value in entries.items():
            if not isinstance(value, str):
                raise ManifestError(source, f"{path}.{field}.{key}", "must be a string")
            problem = _qualified_name_problem(key)
            if (
                problem is None
                and field == "labels"
                and (len(value) > 63 or not _LABEL_NAME.match(value))
            ):
                problem = f"label value {value!r} is not valid (at most 63 of A-Z a-z 0-9 - _ .)"
            if problem is not None:
                raise ManifestError(source, f"{path}.{field}.{key}", problem)
    return name


def _qualified_name_problem(key: str) -> str | None:
    """Why `key` is not a Kubernetes qualified name (`[prefix/]name`), or None."""
    prefix, _, name = key.rpartition("/")
    if "/" in key and (len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)):
        return f"key prefix {prefix!r} must be a DNS subdomain"
    if not name or len(name) > 63 or not _LABEL_NAME.match(name):
        return f"key {key!r} is not a qualified name (at most 63 of A-Z a-z 0-9 - _ .)"
    return None


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
