"""The operator's handle on the Kubernetes API: the process's one `KubeClient`.

kopf handlers are plain functions with no place to pass a client, so the
operator keeps one per process, made by `load_config()` at startup. Every
call goes through `lmedge.backends.kubernetes.client.KubeClient`, so the
operator, the backend and the node agents share one set of timeouts, retries
and one error classification (`NotFound`, `ClusterRefused`,
`ClusterUnavailable`); this module imports no `kubernetes` itself.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lmedge.backends.kubernetes.client import GROUP, VERSION, KubeClient
from lmedge.backends.kubernetes.pods import ObservedPod
from lmedge.errors import NotFound

__all__ = [
    "GROUP",
    "VERSION",
    "NotFound",
    "apply_configmap",
    "client",
    "label_node",
    "list_edge_nodes",
    "list_lmservices",
    "list_model_pods",
    "list_nodes",
    "load_config",
    "node_allocatable",
    "read_edge_node",
    "set_configmap_data",
    "set_edge_node_conditions",
]

_lock = threading.Lock()
_client: KubeClient | None = None


def load_config(kubeconfig: str | Path | None = None) -> KubeClient:
    """The process's client, connected on first use: in-cluster in a pod, else the kubeconfig."""
    global _client
    with _lock:
        if _client is None:
            _client = KubeClient.connect(kubeconfig)
        return _client


def client() -> KubeClient:
    """The process's client (connected by `load_config` on first use)."""
    return _client if _client is not None else load_config()


def node_allocatable(name: str) -> dict[str, str]:
    return client().node_allocatable(name)


def label_node(name: str, labels: Mapping[str, str | None]) -> None:
    """Merge-patch labels onto a Node; a None value removes the label."""
    client().label_node(name, labels)


def list_nodes() -> list[dict[str, Any]]:
    return client().list_nodes()


def list_edge_nodes() -> list[dict[str, Any]]:
    return client().list_edge_nodes()


def list_lmservices(namespace: str) -> list[dict[str, Any]]:
    return client().list_lmservices(namespace)


def read_edge_node(name: str) -> dict[str, Any] | None:
    """The EdgeNode as JSON; None when there is no such EdgeNode."""
    k = client()
    try:
        obj: Any = k.call(
            f"read EdgeNode {name}",
            k.custom.get_cluster_custom_object,
            GROUP,
            VERSION,
            "edgenodes",
            name,
        )
    except NotFound:
        return None
    return dict(obj)


def set_edge_node_conditions(name: str, conditions: list[dict[str, Any]]) -> None:
    """Merge-patch the EdgeNode's status conditions (the status subresource)."""
    k = client()
    k.call(
        f"patch EdgeNode {name} status",
        k.custom.patch_cluster_custom_object_status,
        GROUP,
        VERSION,
        "edgenodes",
        name,
        {"status": {"conditions": conditions}},
    )


def set_configmap_data(namespace: str, name: str, data: Mapping[str, str]) -> bool:
    return client().set_configmap_data(namespace, name, data)


def apply_configmap(manifest: dict[str, Any]) -> None:
    client().apply_configmap(manifest)


def list_model_pods(namespace: str | None) -> list[ObservedPod]:
    """Model pods of `namespace` (of every namespace when None)."""
    return client().list_model_pods(namespace)
