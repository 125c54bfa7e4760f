"""The NVIDIA device plugin's time-slicing configuration, rendered from EdgeNodes.

The device plugin reads a ConfigMap whose keys are named configs; a node picks
one with the label `nvidia.com/device-plugin.config=<key>`. Each distinct
`vgpusPerGpu` becomes one key, `lmedge-replicas-<n>`:

    version: v1
    flags: {migStrategy: none}
    sharing:
      timeSlicing:
        resources:
        - name: nvidia.com/gpu
          replicas: <n>

With replicas n, a node with g GPUs advertises `nvidia.com/gpu: g*n`, which is
what `EdgeNodeSpec.total_vgpus` plans with. `renameByDefault` stays false so pods
keep asking for `nvidia.com/gpu`. Nodes without GPUs get no label.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import yaml

from lmedge.api import NodeInfo
from lmedge.backends.kubernetes.pods import GPU_RESOURCE

CONFIG_LABEL = "nvidia.com/device-plugin.config"


def config_key(replicas: int) -> str:
    return f"lmedge-replicas-{replicas}"


def device_plugin_config(replicas: int) -> dict[str, Any]:
    sharing: dict[str, Any] = {}
    if replicas > 1:
        sharing = {
            "timeSlicing": {
                "renameByDefault": False,
                "failRequestsGreaterThanOne": False,
                "resources": [{"name": GPU_RESOURCE, "replicas": replicas}],
            }
        }
    config: dict[str, Any] = {"version": "v1", "flags": {"migStrategy": "none"}}
    if sharing:
        config["sharing"] = sharing
    return config


def render_configmap(nodes: Iterable[NodeInfo], name: str, namespace: str) -> dict[str, Any]:
    """The ConfigMap holding one device-plugin config per distinct replica count."""
    counts = sorted({n.spec.vgpus_per_gpu for n in nodes if n.spec.has_gpu})
    data = {config_key(r): yaml.safe_dump(device_plugin_config(r), sort_keys=False) for r in counts}
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {
                "app.kubernetes.io/name": "lmedge",
                "app.kubernetes.io/component": "time-slicing-config",
                "app.kubernetes.io/managed-by": "lmedge",
            },
        },
        "data": data,
    }


def node_labels(node: NodeInfo) -> dict[str, str | None]:
    """Labels the operator puts on the Node (None removes a label)."""
    spec = node.spec
    return {
        "lmedge.io/edge-node": "true",
        "lmedge.io/role": spec.role,
        "lmedge.io/site": spec.site,
        "lmedge.io/gpu": "true" if spec.has_gpu else "false",
        CONFIG_LABEL: config_key(spec.vgpus_per_gpu) if spec.has_gpu else None,
    }
