"""The live context's logic without an API server: which Nodes are down, what
counts as a change, the context a view gives, the cache's change detection,
and pods replaced when their LMService is edited."""

from __future__ import annotations

import copy
import logging
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from lmedge.api import LMPlacement, LoopConstants, Placement, ServiceInfo
from lmedge.api.manifests import load_resources
from lmedge.backends.kubernetes import live as live_module
from lmedge.backends.kubernetes.client import KubeClient, RetryPolicy
from lmedge.backends.kubernetes.live import (
    ClusterView,
    LiveCluster,
    context_of,
    diff_views,
    node_down_reason,
    view_of,
)
from lmedge.backends.kubernetes.pods import model_pod, observe_pod, plan_node

EXAMPLES = Path(__file__).parents[3] / "examples" / "testbed"
NODES, SERVICES = load_resources(EXAMPLES)


def edge_objects() -> dict[str, dict[str, Any]]:
    return {
        n.name: {"metadata": {"name": n.name}, "spec": n.spec.model_dump(by_alias=True)}
        for n in NODES
    }


def service_objects() -> dict[str, dict[str, Any]]:
    return {
        s.name: {
            "metadata": {"name": s.name, "uid": f"uid-{s.name}"},
            "spec": s.spec.model_dump(by_alias=True),
        }
        for s in SERVICES
    }


def ready(ok: bool = True, reason: str = "KubeletReady") -> dict[str, Any]:
    cond = {"type": "Ready", "status": "True" if ok else "False", "reason": reason}
    return {"status": {"conditions": [cond]}}


WORKERS = [n.name for n in NODES if n.spec.role == "worker"]


def healthy() -> dict[str, str | None]:
    return dict.fromkeys(WORKERS)


def test_node_down_reasons() -> None:
    assert node_down_reason(ready()) is None
    assert node_down_reason(ready(False, "KubeletNotReady")) == "Node NotReady (KubeletNotReady)"
    unknown = {"status": {"conditions": [{"type": "Ready", "status": "Unknown"}]}}
    assert node_down_reason(unknown) == "Node NotReady (Ready=Unknown)"
    cordoned = {**ready(), "spec": {"unschedulable": True}}
    assert node_down_reason(cordoned) == "Node cordoned (spec.unschedulable)"
    assert node_down_reason({"status": {}}) == "Node NotReady (no Ready condition yet)"
    assert node_down_reason(None) == "no Node of that name"


def test_view_leaves_down_workers_out_of_the_context_and_keeps_control() -> None:
    health = {**healthy(), "worker-3": "Node cordoned (spec.unschedulable)"}
    del health["worker-5"]  # no Node at all
    view = view_of(edge_objects(), service_objects(), health)

    ctx = context_of(view, LoopConstants(slot_s=2.0))

    assert view.down == {
        "worker-3": "Node cordoned (spec.unschedulable)",
        "worker-5": "no Node of that name",
    }
    workers = [n.name for n in ctx.workers]
    assert "worker-3" not in workers and "worker-5" not in workers
    assert sorted(workers) == sorted(set(WORKERS) - {"worker-3", "worker-5"})
    # a control node has no Node in the testbed and is not judged by one
    assert any(n.spec.role != "worker" for n in ctx.nodes)
    assert ctx.lm_names == sorted(s.name for s in SERVICES)
    assert ctx.loop.slot_s == 2.0


def test_view_without_node_health_keeps_every_edge_node() -> None:
    view = view_of(edge_objects(), service_objects(), None)

    assert view.down == {}
    assert len(context_of(view, LoopConstants()).nodes) == len(NODES)


def test_deleting_and_invalid_objects_are_left_out() -> None:
    services = service_objects()
    services["lm1"]["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    services["lm2"]["spec"]["deploymentMemoryGib"] = -1
    edges = edge_objects()
    edges["worker-1"]["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"

    view = view_of(edges, services, healthy())

    assert "lm1" not in view.services and "lm2" not in view.services
    assert "worker-1" not in view.edge_nodes


def test_diff_names_each_kind_of_change() -> None:
    old = view_of(edge_objects(), service_objects(), healthy())
    services = service_objects()
    del services["lm1"]
    services["lm2"]["spec"]["image"] = "lmedge/model-server:v2"
    services["lm9"] = copy.deepcopy(services["lm3"])
    services["lm9"]["metadata"] = {"name": "lm9", "uid": "uid-lm9"}
    edges = edge_objects()
    del edges["worker-1"]
    edges["worker-2"]["spec"]["cpuCores"] = 8
    health = {**healthy(), "worker-4": "Node NotReady (KubeletNotReady)"}

    changes = diff_views(old, view_of(edges, services, health))

    got = [(c.kind, c.name) for c in changes]
    assert got == [
        ("lm_removed", "lm1"),
        ("lm_edited", "lm2"),
        ("lm_added", "lm9"),
        ("node_removed", "worker-1"),
        ("node_edited", "worker-2"),
        ("node_down", "worker-4"),
    ]
    edited = next(c for c in changes if c.kind == "lm_edited")
    assert edited.detail == "image"
    down = next(c for c in changes if c.kind == "node_down")
    assert down.detail == "Node NotReady (KubeletNotReady)"


def test_diff_reports_a_node_coming_back_and_a_recreated_service() -> None:
    down = view_of(edge_objects(), service_objects(), {**healthy(), "worker-4": "NotReady"})
    services = service_objects()
    services["lm3"]["metadata"]["uid"] = "uid-new"

    changes = diff_views(down, view_of(edge_objects(), services, healthy()))

    assert [(c.kind, c.name) for c in changes] == [("lm_edited", "lm3"), ("node_up", "worker-4")]
    assert changes[0].detail == "re-created"


def test_no_change_is_no_change() -> None:
    view = view_of(edge_objects(), service_objects(), healthy())
    assert diff_views(view, view_of(edge_objects(), service_objects(), healthy())) == []
    assert diff_views(ClusterView(), ClusterView()) == []


class Listing(KubeClient):
    """The thin client answering lists from dicts the test changes."""

    def __init__(self) -> None:
        super().__init__(k8s.ApiClient(), RetryPolicy(attempts=1))
        self.edges = edge_objects()
        self.services = service_objects()

    def list_edge_nodes(self) -> list[dict[str, Any]]:
        return copy.deepcopy(list(self.edges.values()))

    def list_lmservices(self, namespace: str) -> list[dict[str, Any]]:
        return copy.deepcopy(list(self.services.values()))


def test_polling_cache_reports_each_change_once_and_status_is_no_change() -> None:
    kube = Listing()
    live = LiveCluster(kube, "ns", LoopConstants(), watch=False)
    first = live.update(0)
    kube.services["lm1"]["status"] = {"activeInstances": 3}  # the operator writes status
    second = live.update(1)
    kube.services["lm1"]["spec"]["deploymentMemoryGib"] = 5.0
    third = live.update(2)
    fourth = live.update(3)

    assert (first.changed, second.changed) == (False, False)
    assert second.context is first.context  # nothing rebuilt
    assert [(c.kind, c.name, c.detail) for c in third.changes] == [
        ("lm_edited", "lm1", "deploymentMemoryGib")
    ]
    assert third.needs_replan
    assert third.context.service("lm1").spec.deployment_memory_gib == 5.0
    assert fourth.changes == []
    assert live.owners()["lm1"] == "uid-lm1"


def test_watch_events_update_the_cache_but_heartbeats_do_not() -> None:
    live = LiveCluster(Listing(), "ns", LoopConstants(), watch=False)
    live.watching = True  # events arrive as a watch thread would apply them
    live._follow_nodes = True
    for w in WORKERS:
        live._apply("nodes", "ADDED", {"metadata": {"name": w}, **ready()})
    assert live.update(0).changes == []  # every worker was up: nothing went down
    live._apply("nodes", "MODIFIED", {"metadata": {"name": "worker-2"}, **ready()})
    assert not live.update(1).changed  # a heartbeat
    live._apply("nodes", "MODIFIED", {"metadata": {"name": "worker-2"}, **ready(False)})
    down = live.update(2)
    live._apply("nodes", "DELETED", {"metadata": {"name": "worker-2"}})
    still = live.update(3)

    assert [(c.kind, c.name) for c in down.changes] == [("node_down", "worker-2")]
    assert not down.context.has_node("worker-2")
    assert still.changes == []  # down either way
    assert live.view().down["worker-2"] == "no Node of that name"


def test_an_edited_service_makes_its_running_pods_stale() -> None:
    svc = {s.name: s for s in SERVICES}
    p = LMPlacement(lm="lm4", mode="gpu", cpu_cores=2.5, vgpus=2)
    pod = model_pod(svc["lm4"], p, "worker-6", "ns")
    pod["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
    observed = [observe_pod(pod)]
    desired = Placement(node="worker-6", lms=[p])
    edited = {
        **svc,
        "lm4": ServiceInfo(
            name="lm4", spec=svc["lm4"].spec.model_copy(update={"image": "lmedge/model:v2"})
        ),
    }

    same = plan_node(desired, observed, svc)
    replaced = plan_node(desired, observed, edited)
    gone = plan_node(desired, observed, {k: v for k, v in svc.items() if k != "lm4"})

    assert (same.delete, same.unchanged) == ([], ["lm4"])
    assert replaced.delete == [pod["metadata"]["name"]]
    assert [t.lm for t in replaced.create] == ["lm4"]
    new_name = model_pod(edited["lm4"], p, "worker-6", "ns")["metadata"]["name"]
    assert new_name != pod["metadata"]["name"]  # the new pod never collides with the old
    assert (gone.delete, gone.create) == ([pod["metadata"]["name"]], [])


def test_a_watch_thread_outlives_an_unexpected_error(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    live = LiveCluster(Listing(), "ns", LoopConstants(), watch=False)
    relists: list[str] = []

    def relist(resource: str) -> str:
        relists.append(resource)
        if len(relists) == 1:
            raise KeyError("PYTEST_CURRENT_TEST")  # e.g. os.environ changed under a read
        live._stop.set()
        return "7"

    monkeypatch.setattr(live, "_relist", relist)
    monkeypatch.setattr(live, "_watch", lambda resource, version: version)
    monkeypatch.setattr(live_module, "BACKOFF_S", 0.0)
    with caplog.at_level(logging.WARNING):
        live._follow("edgenodes", None)  # returns once stopped; raises nothing
    assert relists == ["edgenodes", "edgenodes"]
    assert "unexpected KeyError" in caplog.text
