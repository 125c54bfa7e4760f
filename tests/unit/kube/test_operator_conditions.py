"""The LMService and EdgeNode conditions the operator writes, and the stats window."""

from __future__ import annotations

from typing import Any

from lmedge.api import (
    ClusterContext,
    EdgeNodeSpec,
    GPUSpec,
    LMPlacement,
    LMServiceSpec,
    NodeInfo,
    ServiceInfo,
)
from lmedge.backends.kubernetes.pods import model_pod, observe_pod
from lmedge.operator.logic import (
    ServiceStats,
    StatsWindow,
    Totals,
    edge_node_ready_condition,
    lmservice_status,
    unschedulable_reason,
    with_condition,
)

BIG = {
    "model": "llava",
    "modality": "image-to-text",
    "image": "img:1",
    "deploymentMemoryGib": 6,
    "minMemoryGib": 4,
    "minVramGib": 14,
    "runsOn": "gpu-only",
    "maxVgpus": 1,
    "profile": {"gpuSecondsPerPrompt": 5},
}
GPU_NODE = EdgeNodeSpec(cpu_cores=16, memory_gib=24, gpus=[GPUSpec(vram_gib=24)], vgpus_per_gpu=2)
CPU_NODE = EdgeNodeSpec(cpu_cores=16, memory_gib=24)


def service(name: str = "big", **changes: Any) -> ServiceInfo:
    return ServiceInfo(name=name, spec=LMServiceSpec.model_validate({**BIG, **changes}))


def context(*nodes: tuple[str, EdgeNodeSpec], services: list[ServiceInfo]) -> ClusterContext:
    return ClusterContext(nodes=[NodeInfo(name=n, spec=s) for n, s in nodes], services=services)


def pod(svc: ServiceInfo, node: str, *, ready: bool, vgpus: int = 1) -> Any:
    p = model_pod(svc, LMPlacement(lm=svc.name, mode="gpu", cpu_cores=2, vgpus=vgpus), node, "ns")
    p["status"] = {
        "phase": "Running" if ready else "Pending",
        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
    }
    return observe_pod(p)


def conditions(status: dict[str, Any]) -> dict[str, tuple[str, str, str]]:
    return {c["type"]: (c["status"], c["reason"], c["message"]) for c in status["conditions"]}


def test_unschedulable_names_the_missing_vram() -> None:
    # 24 GiB GPU in 2 vGPUs; another LM's pod holds 14 GiB of it: 10 GiB is left
    big, other = service(), service("other")
    ctx = context(("w1", GPU_NODE), services=[big, other])
    holder = pod(other, "w1", ready=True)

    status = lmservice_status([], None, 3, lm="big", ctx=ctx, all_pods=[holder])

    got = conditions(status)
    assert got["Unschedulable"] == ("True", "NoCapacity", "no node has 14 GiB vRAM free")
    assert got["Ready"] == (
        "False",
        "NoInstance",
        "no model pod is placed: no node has 14 GiB vRAM free",
    )


def test_unschedulable_when_no_up_worker_could_ever_host_it() -> None:
    ctx = context(("cpu-only", CPU_NODE), services=[service()])
    assert unschedulable_reason("big", ctx, {}) == "it runs on GPU only and no up worker has a GPU"
    assert unschedulable_reason("big", context(services=[service()]), {}) == "no worker node is up"
    huge = context(("w1", GPU_NODE), services=[service(deploymentMemoryGib=64, minMemoryGib=4)])
    assert unschedulable_reason("big", huge, {}) == (
        "it needs 64 GiB memory and the largest up worker has 24 GiB"
    )


def test_ready_and_degraded_by_pods_down_nodes_and_success_ratio() -> None:
    big = service()
    ctx = context(("w1", GPU_NODE), ("w2", GPU_NODE), services=[big])
    serving = [pod(big, "w1", ready=True), pod(big, "w2", ready=False)]

    healthy = conditions(
        lmservice_status(
            serving[:1], ServiceStats(50, 1.0, 3.0), 1, lm="big", ctx=ctx, all_pods=serving[:1]
        )
    )
    degraded = conditions(
        lmservice_status(
            serving,
            ServiceStats(20, 0.5, 3.0),
            1,
            lm="big",
            ctx=ctx,
            all_pods=serving,
            down={"w1": "Node NotReady (KubeletNotReady)"},
        )
    )
    starting = conditions(lmservice_status(serving[1:], None, 1, lm="big", ctx=ctx))

    assert healthy["Ready"] == ("True", "InstancesReady", "1 ready on w1")
    assert healthy["Degraded"][:2] == ("False", "Healthy")
    assert healthy["Unschedulable"][0] == "False"
    assert degraded["Degraded"][:2] == ("True", "NodeDown")
    message = degraded["Degraded"][2]
    assert "w1: Node NotReady (KubeletNotReady)" in message
    assert "1 of 2 model pods not ready" in message
    assert "50% of the last 20 requests succeeded" in message
    assert starting["Ready"] == ("False", "Starting", "1 model pod(s) starting (cold start)")


def test_a_condition_keeps_its_transition_time_while_unchanged() -> None:
    big = service()
    ctx = context(("w1", GPU_NODE), services=[big])
    first = lmservice_status([], None, 1, lm="big", ctx=ctx)
    old = [{**c, "lastTransitionTime": "2020-01-01T00:00:00Z"} for c in first["conditions"]]
    ready = [pod(big, "w1", ready=True)]

    again = lmservice_status(ready, None, 1, lm="big", ctx=ctx, all_pods=ready, previous=old)

    times = {c["type"]: c["lastTransitionTime"] for c in again["conditions"]}
    assert times["Valid"] == "2020-01-01T00:00:00Z"  # still True
    assert times["Ready"] != "2020-01-01T00:00:00Z"  # False -> True


def test_stats_window_forgets_what_is_older_than_the_window() -> None:
    w = StatsWindow(window_s=60)
    first = w.add("r", 0.0, Totals(10, 0, 0.0))
    w.add("r", 30.0, Totals(20, 10, 20.0))
    later = w.add("r", 90.0, Totals(40, 30, 60.0))
    other_run = w.add("r2", 100.0, Totals(5, 5, 5.0))

    assert (first.requests, first.success_ratio) == (10, 0.0)
    # the window is (30, 90]: 20 requests, 20 successes, 40 s latency
    assert (later.requests, later.success_ratio, later.mean_latency_s) == (20, 1.0, 2.0)
    assert (other_run.requests, other_run.success_ratio) == (5, 1.0)


def test_edge_node_ready_condition_and_merge() -> None:
    cordoned = edge_node_ready_condition("worker", "Node cordoned (spec.unschedulable)")
    assert (cordoned["status"], cordoned["reason"]) == ("False", "Cordoned")
    assert "left out of routing and planning" in cordoned["message"]
    assert edge_node_ready_condition("worker", "Node NotReady (x)")["reason"] == "NodeNotReady"
    assert edge_node_ready_condition("worker", None)["status"] == "True"
    assert edge_node_ready_condition("control", "no Node of that name")["status"] == "True"
    capacity = {"type": "CapacityMatches", "status": "True", "reason": "r", "message": "m"}

    merged = with_condition([capacity], cordoned)

    assert [c["type"] for c in merged] == ["CapacityMatches", "NodeReady"]
