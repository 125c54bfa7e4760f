"""What the operator decides, as plain functions (the kopf handlers stay thin).

- An `EdgeNode` is checked against its Node's allocatable resources: a spec
  that promises more CPU, memory or vGPUs than the kubelet advertises would
  make the planners schedule pods the cluster refuses.
- An `LMService`'s status reports its active instances per node (from the
  model pods) and its success ratio and mean latency (from the store).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, TypeVar

from kubernetes.utils.quantity import parse_quantity as _parse_quantity
from pydantic import BaseModel, ValidationError

from lmedge.api import EdgeNodeSpec
from lmedge.api.manifests import format_validation_error
from lmedge.backends.kubernetes.pods import GPU_RESOURCE, ObservedPod
from lmedge.errors import ManifestError

M = TypeVar("M", bound=BaseModel)


def parse_quantity(q: str | int | float) -> Decimal:
    """A Kubernetes resource quantity ("16", "250m", "24Gi") as a number."""
    return Decimal(_parse_quantity(q))  # type: ignore[no-untyped-call]


def parse_spec(model: type[M], spec: Mapping[str, Any], kind: str, name: str) -> M:
    """Validate a CR spec; a bad one is a `ManifestError` naming the field."""
    try:
        return model.model_validate(dict(spec))
    except ValidationError as exc:
        field, msg = format_validation_error(exc, f"{kind}/{name}.spec")
        raise ManifestError(f"{kind} {name}", field, msg) from exc


def capacity_problems(spec: EdgeNodeSpec, allocatable: Mapping[str, str]) -> list[str]:
    """Every way the EdgeNode promises more than the Node can allocate."""
    out: list[str] = []
    cpu = parse_quantity(allocatable.get("cpu", "0"))
    mem_gib = parse_quantity(allocatable.get("memory", "0")) / Decimal(2**30)
    gpus = parse_quantity(allocatable.get(GPU_RESOURCE, "0"))
    if Decimal(str(spec.cpu_cores)) > cpu:
        out.append(f"spec.cpuCores={spec.cpu_cores:g} but the Node allocates {cpu:g} CPU")
    if Decimal(str(spec.memory_gib)) > mem_gib + Decimal("0.01"):
        out.append(
            f"spec.memoryGib={spec.memory_gib:g} but the Node allocates {float(mem_gib):.2f} GiB"
        )
    if spec.total_vgpus and gpus == 0:
        out.append(
            f"spec declares {spec.total_vgpus} vGPUs but the Node advertises no {GPU_RESOURCE} "
            "(is the NVIDIA device plugin running with the time-slicing config?)"
        )
    elif spec.total_vgpus > gpus:
        out.append(
            f"spec declares {spec.total_vgpus} vGPUs "
            f"({len(spec.gpus)} GPUs x {spec.vgpus_per_gpu}) but the Node advertises {gpus:g}"
        )
    return out


def condition(kind: str, ok: bool, reason: str, message: str) -> dict[str, str]:
    return {
        "type": kind,
        "status": "True" if ok else "False",
        "reason": reason,
        "message": message,
        "lastTransitionTime": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def edge_node_status(
    spec: EdgeNodeSpec, problems: Sequence[str], generation: int
) -> dict[str, Any]:
    ok = not problems
    return {
        "gpus": len(spec.gpus),
        "vgpus": spec.total_vgpus,
        "observedGeneration": generation,
        "conditions": [
            condition(
                "CapacityMatches",
                ok,
                "AllocatableChecked" if ok else "AllocatableMismatch",
                "spec fits the Node's allocatable resources" if ok else "; ".join(problems),
            )
        ],
    }


@dataclass(frozen=True)
class ServiceStats:
    """Outcome aggregates of one LM service over the store's recent records."""

    requests: int
    success_ratio: float | None
    mean_latency_s: float | None
    rejected: int = 0  # refused by admission control; part of `requests`, failures


def lmservice_status(
    pods: Sequence[ObservedPod], stats: ServiceStats | None, generation: int
) -> dict[str, Any]:
    per_node: dict[str, int] = {}
    for p in pods:
        if p.ready and not p.deleting:
            per_node[p.node] = per_node.get(p.node, 0) + 1
    status: dict[str, Any] = {
        "activeInstances": sum(per_node.values()),
        "instancesPerNode": dict(sorted(per_node.items())),
        "observedGeneration": generation,
    }
    if stats is not None and stats.requests:
        if stats.success_ratio is not None:
            status["successRatio"] = round(stats.success_ratio, 4)
        if stats.mean_latency_s is not None:
            status["meanLatencySeconds"] = round(stats.mean_latency_s, 2)
        status["rejectedRatio"] = round(stats.rejected / stats.requests, 4)
    return status


def model_images(services: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """The node agents' admission parameter: `<lm>.image` and `<lm>.uid` per LMService.

    The ValidatingAdmissionPolicy that confines the node agents admits a
    model pod only with its LMService's image and an owner reference to that
    LMService's uid; it reads both from this ConfigMap data (a policy can
    read one parameter object, not look the LMService up). LMServices being
    deleted, or without an image, are left out.
    """
    data: dict[str, str] = {}
    for obj in services:
        meta = obj.get("metadata") or {}
        image = (obj.get("spec") or {}).get("image")
        if meta.get("deletionTimestamp") or not image or not meta.get("name"):
            continue
        data[f"{meta['name']}.image"] = str(image)
        data[f"{meta['name']}.uid"] = str(meta.get("uid", ""))
    return dict(sorted(data.items()))
