"""What the operator decides, as plain functions (the kopf handlers stay thin).

- An `EdgeNode` is checked against its Node's allocatable resources: a spec
  that promises more CPU, memory or vGPUs than the kubelet advertises would
  make the planners schedule pods the cluster refuses.
- An `LMService`'s status reports its active instances per node (from the
  model pods), its success ratio and mean latency over the last window (from
  the store), and conditions a person can act on: Ready (an instance
  serves), Degraded (it serves, but badly: pods not ready, instances on a
  down node, or a low success ratio), Unschedulable (nothing serves it and
  no up worker has room for it, with the resource that is missing).
- An `EdgeNode`'s status says whether its Node is Ready and schedulable.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from lmedge.api import ClusterContext, EdgeNodeSpec, NodeState
from lmedge.api.engines import ModelSource
from lmedge.api.manifests import format_validation_error
from lmedge.backends.kubernetes.backend import node_state
from lmedge.backends.kubernetes.client import parse_quantity
from lmedge.backends.kubernetes.pods import GPU_RESOURCE, ObservedPod
from lmedge.errors import ManifestError

M = TypeVar("M", bound=BaseModel)


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


@dataclass(frozen=True)
class Totals:
    """One LM's cumulative record counts in a run, as the store aggregates them."""

    requests: int
    successes: int
    latency_s: float  # summed over the successes
    rejected: int = 0


#: A success ratio over the window below this makes an LMService Degraded.
DEGRADED_SUCCESS_RATIO = 0.9


class StatsWindow:
    """Outcomes over the last `window_s` seconds from cumulative totals.

    The store aggregates a whole run; the operator keeps the totals it read
    at each status refresh and subtracts the oldest one still inside the
    window, so a service that failed an hour ago and serves well now shows
    it. Records are counted when the store has them. Until the operator has
    watched one window, its first refresh stands for the run so far and the
    window runs from that refresh.
    """

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._seen: deque[tuple[float, Totals]] = deque()
        self._run = ""

    def add(self, run: str, now: float, totals: Totals) -> ServiceStats:
        """Record `totals` of `run` at `now` and return the window's stats."""
        if run != self._run:
            self._seen.clear()
            self._run = run
        self._seen.append((now, totals))
        while len(self._seen) > 1 and self._seen[1][0] <= now - self.window_s:
            self._seen.popleft()
        base = self._seen[0][1] if len(self._seen) > 1 else Totals(0, 0, 0.0)
        n = totals.requests - base.requests
        ok = totals.successes - base.successes
        latency = totals.latency_s - base.latency_s
        return ServiceStats(
            requests=n,
            success_ratio=ok / n if n > 0 else None,
            mean_latency_s=latency / ok if ok > 0 else None,
            rejected=totals.rejected - base.rejected,
        )


def _gib(x: float) -> str:
    return f"{x:g} GiB"


def unschedulable_reason(
    lm: str, ctx: ClusterContext, states: Mapping[str, NodeState]
) -> str | None:
    """Why no up worker can start an instance of `lm` now, in words; None when one can.

    `ctx` holds the workers that are up; `states` their free resources. The
    message names the requirement no node meets (e.g. "no node has 4 GiB vRAM
    free").
    """
    spec = ctx.service(lm).spec
    if not ctx.workers:
        return "no worker node is up"
    hosts = [n for n in ctx.workers if ctx.can_host(n.name, lm)]
    if not hosts:
        if spec.runs_on == "gpu-only" and not any(n.spec.has_gpu for n in ctx.workers):
            return "it runs on GPU only and no up worker has a GPU"
        if spec.runs_on == "gpu-only" and spec.min_vram_gib > max(
            n.spec.total_vram_gib for n in ctx.workers
        ):
            return f"it needs {_gib(spec.min_vram_gib)} vRAM and no up worker has that much"
        biggest = max(n.spec.memory_gib for n in ctx.workers)
        if spec.deployment_memory_gib > biggest:
            return (
                f"it needs {_gib(spec.deployment_memory_gib)} memory and the largest up worker "
                f"has {_gib(biggest)}"
            )
        return f"no up worker has {spec.min_cpu_cores:g} CPU cores (minCpuCores) for it"
    missing: list[str] = []
    for n in hosts:
        st = states.get(n.name)
        if st is None:
            return None  # unknown: do not claim it cannot be placed
        if st.free_memory_gib < spec.deployment_memory_gib:
            missing.append(f"{_gib(spec.deployment_memory_gib)} memory")
            continue
        gpu_ok = n.spec.has_gpu and st.free_vgpus >= 1 and st.free_vram_gib >= spec.min_vram_gib
        cpu_ok = spec.runs_on == "cpu-or-gpu" and st.free_cpu_cores >= spec.min_cpu_cores
        if gpu_ok or cpu_ok:
            return None
        if spec.runs_on == "gpu-only" and st.free_vgpus >= 1:
            missing.append(f"{_gib(spec.min_vram_gib)} vRAM")
        elif spec.runs_on == "gpu-only":
            missing.append("a vGPU")
        else:
            missing.append(f"{spec.min_cpu_cores:g} CPU cores or a vGPU")
    first = max(set(missing), key=missing.count)
    return f"no node has {first} free"


def _merge_transitions(
    new: list[dict[str, str]], old: Sequence[Mapping[str, Any]] | None
) -> list[dict[str, str]]:
    """Keep a condition's lastTransitionTime while its status stays the same."""
    before = {c.get("type"): c for c in old or []}
    for c in new:
        prev = before.get(c["type"])
        if (
            prev is not None
            and prev.get("status") == c["status"]
            and prev.get("lastTransitionTime")
        ):
            c["lastTransitionTime"] = str(prev["lastTransitionTime"])
    return new


def lmservice_status(
    pods: Sequence[ObservedPod],
    stats: ServiceStats | None,
    generation: int,
    *,
    lm: str | None = None,
    ctx: ClusterContext | None = None,
    down: Mapping[str, str] | None = None,
    all_pods: Sequence[ObservedPod] = (),
    previous: Sequence[Mapping[str, Any]] | None = None,
    window_s: float | None = None,
) -> dict[str, Any]:
    """The LMService's status from its model pods (`pods`) and the window's `stats`.

    Given `lm` and `ctx` (the up workers and every LMService), also its
    conditions: `all_pods` are the namespace's model pods (they hold the
    nodes' resources), `down` the workers that are down and why, `previous`
    the conditions now in the status (their transition times are kept).
    """
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
    if window_s is not None:
        status["windowSeconds"] = round(window_s)
    if lm is not None and ctx is not None and ctx.has_service(lm):
        conditions = lmservice_conditions(lm, pods, stats, ctx, down or {}, all_pods)
        status["conditions"] = _merge_transitions(conditions, previous)
    return status


def lmservice_conditions(
    lm: str,
    pods: Sequence[ObservedPod],
    stats: ServiceStats | None,
    ctx: ClusterContext,
    down: Mapping[str, str],
    all_pods: Sequence[ObservedPod],
) -> list[dict[str, str]]:
    """Valid, Ready, Degraded and Unschedulable, each with a reason a person understands."""
    live = [p for p in pods if not p.deleting]
    ready = sorted({p.node for p in live if p.ready})
    starting = [p for p in live if not p.ready]
    stranded = sorted({p.node for p in live if p.node in down})
    services = {s.name: s for s in ctx.services}
    states = {n.name: node_state(n, all_pods, services) for n in ctx.workers}
    blocked = unschedulable_reason(lm, ctx, states)
    out = [condition("Valid", True, "SpecValid", "spec validated by the operator")]
    if ready:
        n = sum(1 for p in live if p.ready)
        out.append(condition("Ready", True, "InstancesReady", f"{n} ready on {', '.join(ready)}"))
    elif starting:
        out.append(
            condition(
                "Ready", False, "Starting", f"{len(starting)} model pod(s) starting (cold start)"
            )
        )
    else:
        why = f": {blocked}" if blocked else ""
        out.append(condition("Ready", False, "NoInstance", f"no model pod is placed{why}"))
    problems: list[tuple[str, str]] = []
    if stranded:
        problems.append(
            (
                "NodeDown",
                "instances on down node(s): " + "; ".join(f"{n}: {down[n]}" for n in stranded),
            )
        )
    if ready and starting:
        problems.append(
            ("InstancesNotReady", f"{len(starting)} of {len(live)} model pods not ready")
        )
    ratio = stats.success_ratio if stats is not None and stats.requests else None
    if stats is not None and ratio is not None and ratio < DEGRADED_SUCCESS_RATIO:
        problems.append(
            (
                "LowSuccessRatio",
                f"{ratio:.0%} of the last {stats.requests} requests succeeded",
            )
        )
    if ready and problems:
        out.append(condition("Degraded", True, problems[0][0], "; ".join(m for _, m in problems)))
    else:
        fine = ("Healthy", "serving normally") if ready else ("NotServing", "no instance serves")
        out.append(condition("Degraded", False, *fine))
    if not live and blocked:
        out.append(condition("Unschedulable", True, "NoCapacity", blocked))
    else:
        out.append(
            condition(
                "Unschedulable",
                False,
                "Schedulable",
                "an instance is placed" if live else "a worker has room for an instance",
            )
        )
    return out


def edge_node_ready_condition(
    role: str, down_reason: str | None, followed: bool = True
) -> dict[str, str]:
    """The EdgeNode's NodeReady condition from its Node's health (`live.node_down_reason`)."""
    if role != "worker":
        return condition("NodeReady", True, "ControlNode", "a control node hosts no LMs")
    if not followed:
        return condition("NodeReady", True, "NotFollowed", "Node health is not read")
    if down_reason is None:
        return condition("NodeReady", True, "NodeReady", "Node Ready and schedulable")
    if down_reason.startswith("Node cordoned"):
        reason = "Cordoned"
    elif down_reason.startswith("no Node"):
        reason = "NodeMissing"
    else:
        reason = "NodeNotReady"
    return condition("NodeReady", False, reason, f"{down_reason}: left out of routing and planning")


def with_condition(
    conditions: Sequence[Mapping[str, Any]] | None, new: dict[str, str]
) -> list[dict[str, Any]]:
    """`conditions` with the one of `new`'s type replaced (its transition time kept if same)."""
    (merged,) = _merge_transitions([new], conditions)
    out = [dict(c) for c in conditions or [] if c.get("type") != new["type"]]
    return [*out, merged]


def model_images(services: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """The node agents' admission parameter: `<lm>.image` and `<lm>.uid` per LMService.

    The ValidatingAdmissionPolicy that confines the node agents admits a
    model pod only with its LMService's image and an owner reference to that
    LMService's uid; it reads both from this ConfigMap data (a policy can
    read one parameter object, not look the LMService up). For a llama.cpp
    or vllm engine also `<lm>.engine` (the kind, which fixes the shape of
    the pod's args), `<lm>.model` (the weights' path, the one free argument)
    and `<lm>.claim` (the one claim the pod may mount) when it has one.
    LMServices being deleted, or without an image, are left out.
    """
    data: dict[str, str] = {}
    for obj in services:
        meta = obj.get("metadata") or {}
        spec = obj.get("spec") or {}
        image = spec.get("image")
        if meta.get("deletionTimestamp") or not image or not meta.get("name"):
            continue
        lm = meta["name"]
        data[f"{lm}.image"] = str(image)
        data[f"{lm}.uid"] = str(meta.get("uid", ""))
        engine = spec.get("engine") or {}
        if engine.get("kind", "pipeline") != "pipeline":
            try:
                weights = ModelSource.model_validate(engine.get("model") or {})
            except ValidationError:
                continue  # listed as a pipeline: the policy refuses its pods (fails closed)
            data[f"{lm}.engine"] = str(engine["kind"])
            data[f"{lm}.model"] = weights.path
            if weights.claim_name is not None:
                data[f"{lm}.claim"] = weights.claim_name
    return dict(sorted(data.items()))
