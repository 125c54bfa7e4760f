"""The ClusterBackend surface: arrivals, routing defaults, snapshot, telemetry."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from lmedge.api import ClusterBackend, RoutingMap
from lmedge.backends.emulated import EmulatedBackend, load_scenario
from lmedge.sim import Scenario
from tests.sim.conftest import place, route, run_all

TESTBED = Path(__file__).parents[2] / "examples" / "testbed"


def test_is_a_cluster_backend() -> None:
    be: ClusterBackend = EmulatedBackend(load_scenario(TESTBED), seed=0)
    assert be.clock.now() == 0.0
    assert [n.name for n in be.context().workers] == [f"worker-{i}" for i in range(1, 7)]
    be.close()


def test_arrivals_report_the_trace(make_scenario: Callable[..., Scenario]) -> None:
    be = EmulatedBackend(make_scenario([(0, "w1", "a", 3, 1.0), (2, "w3", "b", 5, 0.5)]), seed=0)
    assert [(a.origin, a.lm, a.requests, a.prompts) for a in be.arrivals(0)] == [("w1", "a", 1, 3)]
    assert be.arrivals(1) == []
    assert [(a.origin, a.prompts) for a in be.arrivals(2)] == [("w3", 5)]


def test_unmapped_and_invalid_routes_go_local_or_to_the_nearest_feasible_node(
    make_scenario: Callable[..., Scenario],
) -> None:
    rows = [(0, "w3", "a", 1, 1.0), (0, "w3", "g", 1, 1.0), (0, "w1", "b", 1, 1.0)]
    be = EmulatedBackend(make_scenario(rows), seed=0)
    # g cannot run on CPU-only w3: that route is ignored; b is not mapped at all
    route(be, 0, ("w3", "g", "w3"))
    recs = {r.lm: r for r in run_all(be, 1000)}
    assert recs["a"].destination == "w3"  # local: w3 can host a
    assert recs["g"].destination == "w1"  # nearest GPU node; tie -> manifest order
    assert recs["b"].destination == "w1"


def test_routing_map_applies_to_its_own_slot_only(make_scenario: Callable[..., Scenario]) -> None:
    be = EmulatedBackend(make_scenario([(0, "w1", "a", 1, 1.0), (1, "w1", "a", 1, 1.0)]), seed=0)
    route(be, 0, ("w1", "a", "w2"))
    be.clock.sleep_until(30.0)
    be.publish_routing(1, RoutingMap(routes=[]))
    recs = sorted(run_all(be, 2000), key=lambda r: r.slot)
    assert [r.destination for r in recs] == ["w2", "w1"]
    assert [r.id for r in recs] == ["0-0-w1-a", "0-1-w1-a"]


def test_snapshot_reports_backlog_instances_headroom_and_utilization(
    make_scenario: Callable[..., Scenario],
) -> None:
    be = EmulatedBackend(make_scenario([(0, "w2", "a", 4, 0.0), (0, "w2", "g", 2, 0.0)]), seed=0)
    place(be, "w2", ("a", "gpu", 4, 1), ("b", "cpu", 2, 0))
    be.clock.sleep_until(30.0)
    node = be.snapshot(1).node("w2")
    # a: ready at ~1 s, 10 s per prompt -> 2 done by t = 30; g: no pod, both waiting
    assert node.backlog == {"a": 2, "b": 0, "g": 2}
    assert [(i.lm, i.mode, i.status) for i in node.instances] == [
        ("a", "gpu", "ready"),
        ("b", "cpu", "ready"),
    ]
    assert node.free_cpu_cores == 10 and node.free_memory_gib == 18
    assert node.free_vgpus == 3 and node.free_vram_gib == 47
    # one of two GPUs busy from ~1 s to 30 s
    assert node.gpu_util == pytest.approx(0.5 * 29 / 30, abs=0.01)
    assert node.cpu_util == pytest.approx(1 / 16 * 29 / 30, abs=0.01)
    assert be.snapshot(1).node("w2") == node  # a second reader at the same instant
    (tel,) = [t for t in be.telemetry() if t.node == "w2"]
    assert tel.gpu_util == [pytest.approx(29 / 30, abs=0.01), 0.0]
    assert tel.vram_used_gib == [1.0, 0.0] and tel.memory_util == pytest.approx(6 / 24)
    assert tel.extra["backlog_prompts"] == 4


@pytest.mark.parametrize("name", ["testbed", "testbed-expanded", "bursty", "large"])
def test_every_example_runs(name: str) -> None:
    from lmedge.api import LMPlacement, Placement, nearest_feasible

    be = EmulatedBackend(load_scenario(TESTBED.parent / name), seed=2)
    ctx = be.context()
    for n in ctx.workers:
        gpu = n.spec.has_gpu
        lms = [
            LMPlacement(lm=s.name, mode="gpu" if gpu else "cpu", cpu_cores=4, vgpus=int(gpu))
            for s in ctx.services
        ]
        res = be.apply_placement(nearest_feasible(Placement(node=n.name, lms=lms), n, ctx.services))
        assert res.started and not res.errors
    for t in range(10):
        be.snapshot(t)
        be.arrivals(t)
        be.publish_routing(t, RoutingMap(routes=[]))
        be.clock.sleep_until((t + 1) * ctx.loop.slot_s)
    recs = be.drain_records()
    assert any(r.outcome == "success" for r in recs)
    assert all(r.destination in ctx.feasible_nodes(r.lm) for r in recs)
