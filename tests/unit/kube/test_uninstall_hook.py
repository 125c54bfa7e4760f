"""The chart's pre-delete hook (lmedge.operator.uninstall): delete the
LMServices, wait for the operator to release them and for their model pods to
go, and name what is left when it does not happen in time.

The API is an in-memory stand-in with the operator's behaviour: an LMService
deleted while it has a finalizer stays until the "operator" releases it; its
pods go after it. The real chart and operator are run by the real-node tier
(tests/realnode/test_chart.py::test_helm_uninstall_leaves_no_pod).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from lmedge.backends.kubernetes.pods import ObservedPod
from lmedge.errors import ClusterRefused
from lmedge.operator import uninstall


@dataclass
class FakeCluster:
    """LMServices with finalizers, and the model pods they own."""

    services: dict[str, dict[str, Any]] = field(default_factory=dict)
    pods: dict[str, str] = field(default_factory=dict)  # pod -> its LMService
    operator_up: bool = True
    deletes: list[str] = field(default_factory=list)
    refuse: bool = False

    def add(self, name: str, pods: int = 1) -> None:
        self.services[name] = {"metadata": {"name": name, "finalizers": ["lmedge.io/finalizer"]}}
        for i in range(pods):
            self.pods[f"{name}-pod-{i}"] = name

    def list_lmservices(self, namespace: str) -> list[dict[str, Any]]:
        return list(self.services.values())

    def delete_lmservice(self, namespace: str, name: str) -> bool:
        if self.refuse:
            raise ClusterRefused(f"delete LMService {namespace}/{name}", 403, "forbidden")
        self.deletes.append(name)
        if name not in self.services:
            return False
        self.services[name]["metadata"]["deletionTimestamp"] = "now"
        return True

    def list_model_pods(self, namespace: str | None, node: str | None = None) -> list[ObservedPod]:
        return [ObservedPod(name=p, lm=lm, node="n1", placement_hash="h", phase="Running",
                            ready=True) for p, lm in self.pods.items()]  # fmt: skip

    def tick(self) -> None:
        """One operator step: release the deleted LMServices, then collect orphaned pods."""
        self.pods = {p: lm for p, lm in self.pods.items() if lm in self.services}
        if self.operator_up:
            self.services = {
                n: s for n, s in self.services.items() if "deletionTimestamp" not in s["metadata"]
            }


class Clock:
    def __init__(self, cluster: FakeCluster) -> None:
        self.now = 0.0
        self.cluster = cluster

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.cluster.tick()


def _release(cluster: FakeCluster, timeout_s: float) -> list[str]:
    clock = Clock(cluster)
    return uninstall.release_lmservices(
        cluster,  # type: ignore[arg-type]
        "lm-serving",
        timeout_s,
        poll_s=1.0,
        clock=clock,
        sleep=clock.sleep,
    )


def test_every_lmservice_is_deleted_and_waited_for_with_its_pods() -> None:
    cluster = FakeCluster()
    cluster.add("lm1", pods=2)
    cluster.add("lm2")
    assert _release(cluster, 30) == []
    assert not cluster.services and not cluster.pods
    assert {"lm1", "lm2"} <= set(cluster.deletes)


def test_nothing_to_release_returns_at_once() -> None:
    cluster = FakeCluster()
    assert _release(cluster, 0) == []
    assert cluster.deletes == []


def test_without_the_operator_what_is_left_is_named_with_its_finalizers() -> None:
    cluster = FakeCluster(operator_up=False)
    cluster.add("lm1")
    left = _release(cluster, 5)
    assert left == ["LMService lm1 (finalizers: lmedge.io/finalizer)", "model pod lm1-pod-0"]


def test_main_reports_a_refusal_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = FakeCluster(refuse=True)
    cluster.add("lm1")
    monkeypatch.setattr(uninstall.KubeClient, "connect", classmethod(lambda cls: cluster))
    assert uninstall.main(["--namespace", "lm-serving", "--timeout", "1"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("lmedge uninstall hook: ") and "\n" not in err
    assert "lm1" in err
