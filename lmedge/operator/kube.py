"""The operator's thin client over the Kubernetes API (the only module here that
imports the `kubernetes` client). API failures are classified once: 409, 429
and 5xx are transient (`ClusterUnavailable`, retried), others are permanent."""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from lmedge.backends.kubernetes.pods import LABEL_LM, ObservedPod, observe_pod
from lmedge.errors import ClusterUnavailable, LmedgeError

GROUP = "lmedge.io"
VERSION = "v1alpha1"
TRANSIENT = {409, 429, 500, 502, 503, 504}


class NotFound(LmedgeError):
    """The object does not exist."""


@contextmanager
def api_errors(action: str) -> Iterator[None]:
    try:
        yield
    except ApiException as exc:
        if exc.status == 404:
            raise NotFound(f"{action}: not found") from exc
        if exc.status in TRANSIENT or exc.status == 0:
            raise ClusterUnavailable(f"{action}: HTTP {exc.status} {exc.reason}") from exc
        raise LmedgeError(f"{action}: HTTP {exc.status} {exc.reason}: {exc.body}") from exc
    except OSError as exc:  # connection refused / reset, DNS
        raise ClusterUnavailable(f"{action}: {exc}") from exc


def load_config(kubeconfig: str | None = None) -> None:
    """In-cluster config when running in a pod, else the kubeconfig."""
    try:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    except config.ConfigException:
        # The client reads $KUBECONFIG once, at import; read it now.
        path = kubeconfig or os.environ.get("KUBECONFIG")
        config.load_kube_config(config_file=path)  # type: ignore[no-untyped-call]


def node_allocatable(name: str) -> dict[str, str]:
    with api_errors(f"read Node {name}"):
        node = client.CoreV1Api().read_node(name)
    return dict((node.status.allocatable if node.status else None) or {})


def label_node(name: str, labels: Mapping[str, str | None]) -> None:
    """Merge-patch labels onto a Node; a None value removes the label."""
    with api_errors(f"label Node {name}"):
        client.CoreV1Api().patch_node(name, {"metadata": {"labels": dict(labels)}})


def list_edge_nodes() -> list[dict[str, Any]]:
    with api_errors("list EdgeNodes"):
        out: Any = client.CustomObjectsApi().list_cluster_custom_object(GROUP, VERSION, "edgenodes")
    items: list[dict[str, Any]] = out.get("items", [])
    return items


def list_lmservices(namespace: str) -> list[dict[str, Any]]:
    with api_errors(f"list LMServices in {namespace}"):
        out: Any = client.CustomObjectsApi().list_namespaced_custom_object(
            GROUP, VERSION, namespace, "lmservices"
        )
    items: list[dict[str, Any]] = out.get("items", [])
    return items


def set_configmap_data(namespace: str, name: str, data: Mapping[str, str]) -> bool:
    """Make the ConfigMap's data exactly `data` (created when missing); True if it changed.

    Keys no longer in `data` are removed (a merge patch with null values),
    others are left alone, so RBAC needs only get and patch on this name
    when the chart created the ConfigMap.
    """
    api = client.CoreV1Api()
    with api_errors(f"write ConfigMap {namespace}/{name}"):
        try:
            live = api.read_namespaced_config_map(name, namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise
            body = {"metadata": {"name": name, "namespace": namespace}, "data": dict(data)}
            api.create_namespaced_config_map(namespace, body)  # type: ignore[arg-type]
            return True
        current = dict(live.data or {})
        if current == dict(data):
            return False
        patch: dict[str, str | None] = {k: None for k in current if k not in data}
        patch.update(data)
        api.patch_namespaced_config_map(name, namespace, {"data": patch})
    return True


def apply_configmap(manifest: dict[str, Any]) -> None:
    """Create the ConfigMap, or replace its data when it exists."""
    meta = manifest["metadata"]
    api = client.CoreV1Api()
    with api_errors(f"apply ConfigMap {meta['namespace']}/{meta['name']}"):
        try:
            api.create_namespaced_config_map(meta["namespace"], manifest)  # type: ignore[arg-type]
        except ApiException as exc:
            if exc.status != 409:
                raise
            api.patch_namespaced_config_map(meta["name"], meta["namespace"], manifest)


def observed_pod(pod: Any) -> ObservedPod:
    """The reconciler's view of a pod (with the resources it requests)."""
    return observe_pod(_json(pod))


def list_nodes() -> list[dict[str, Any]]:
    """Every Node as its JSON object (health: Ready condition, spec.unschedulable)."""
    with api_errors("list Nodes"):
        out = client.CoreV1Api().list_node()
    return [_json(n) for n in out.items]


@functools.cache
def _serializer() -> client.ApiClient:
    return client.ApiClient()  # serializing needs no connection or configuration


def _json(obj: Any) -> dict[str, Any]:
    """A client model as its JSON object (API field names)."""
    out: dict[str, Any] = _serializer().sanitize_for_serialization(obj)  # type: ignore[no-untyped-call]
    return out


def list_model_pods(namespace: str | None, lm: str | None = None) -> list[ObservedPod]:
    selector = f"{LABEL_LM}={lm}" if lm else LABEL_LM
    api = client.CoreV1Api()
    with api_errors("list model pods"):
        if namespace:
            pods = api.list_namespaced_pod(namespace, label_selector=selector)
        else:
            pods = api.list_pod_for_all_namespaces(label_selector=selector)
    return [observed_pod(p) for p in pods.items]
