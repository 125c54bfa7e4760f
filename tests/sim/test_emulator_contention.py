"""Time-slicing contention on a physical GPU, CPU-core scaling and f(eta)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from lmedge.backends.emulated import EmulatedBackend
from lmedge.sim import Scenario
from lmedge.sim.synthetic import edge_node
from tests.sim.conftest import place, run_all

TWO = [(0, "w1", "a", 3, 2.0), (0, "w1", "b", 3, 2.0)]


def _inference(
    make_scenario: Callable[..., Scenario],
    node: str,
    lms: list[tuple[str, str, float, int]],
    rows: list[tuple[int, str, str, int, float]],
    **kw: Any,
) -> dict[str, float]:
    sc = make_scenario([(s, node, lm, k, off) for s, _, lm, k, off in rows], **kw)
    be = EmulatedBackend(sc, seed=0)
    place(be, node, *lms)
    return {r.lm: r.inference_s for r in run_all(be, 400)}


def test_two_busy_pods_on_one_gpu_each_take_twice_as_long(
    make_scenario: Callable[..., Scenario],
) -> None:
    alone = _inference(make_scenario, "w1", [("a", "gpu", 4, 1)], TWO[:1], name="alone")
    both = _inference(
        make_scenario, "w1", [("a", "gpu", 4, 1), ("b", "gpu", 4, 1)], TWO, name="both"
    )
    assert alone["a"] == pytest.approx(30.0)
    assert both["a"] == pytest.approx(60.0) and both["b"] == pytest.approx(60.0)


def test_pods_on_different_gpus_do_not_contend(make_scenario: Callable[..., Scenario]) -> None:
    both = _inference(make_scenario, "w2", [("a", "gpu", 4, 1), ("b", "gpu", 4, 1)], TWO)
    assert both == {"a": pytest.approx(30.0), "b": pytest.approx(30.0)}


def test_pack_binding_puts_both_pods_on_one_gpu(make_scenario: Callable[..., Scenario]) -> None:
    both = _inference(
        make_scenario,
        "w2",
        [("a", "gpu", 4, 1), ("b", "gpu", 4, 1)],
        TWO,
        emulation={"gpuBinding": "pack"},
    )
    assert both == {"a": pytest.approx(60.0), "b": pytest.approx(60.0)}


def test_contention_ends_when_the_neighbour_goes_idle(
    make_scenario: Callable[..., Scenario],
) -> None:
    rows = [(0, "w1", "a", 3, 2.0), (0, "w1", "b", 1, 2.0)]
    got = _inference(make_scenario, "w1", [("a", "gpu", 4, 1), ("b", "gpu", 4, 1)], rows)
    # b's one prompt runs at half speed (20 s); a did 10 s of work by then, 20 s remain alone
    assert got["b"] == pytest.approx(20.0)
    assert got["a"] == pytest.approx(40.0)


def test_more_vgpus_buy_a_larger_share_not_a_speedup(
    make_scenario: Callable[..., Scenario],
) -> None:
    alone = _inference(make_scenario, "w2", [("a", "gpu", 4, 2)], TWO[:1], name="alone")
    assert alone["a"] == pytest.approx(30.0)  # spread over two GPUs: still 10 s per prompt
    nodes = [edge_node("w1", gpus=1, vgpus_per_gpu=4)]
    shared = _inference(
        make_scenario,
        "w1",
        [("a", "gpu", 4, 2), ("b", "gpu", 4, 1)],
        TWO,
        nodes=nodes,
        name="shared",
    )
    # a gets 2/3 of the GPU and needs 30 s of work: 45 s; b did 15 s of work by
    # then at 1/3 and finishes its other 15 s alone: 60 s
    assert shared == {"a": pytest.approx(45.0), "b": pytest.approx(60.0)}


def test_gpu_context_switch_slowdown(make_scenario: Callable[..., Scenario]) -> None:
    both = _inference(
        make_scenario,
        "w1",
        [("a", "gpu", 4, 1), ("b", "gpu", 4, 1)],
        TWO,
        emulation={"gpuSlowdown": {"eta0": 0.5, "beta": 0.2}},
    )
    # eta_gpu = 2 busy slots / 2 = 1 -> f = 1 / (1 + 0.2 * 0.5)
    assert both["a"] == pytest.approx(60.0 * 1.1)


@pytest.mark.parametrize(
    ("cores", "seconds"),
    [(4, 20.0), (8, 15.0), (1, 50.0), (16, 20.0 * 2.5 / (1 / (0.2 + 0.8 / 16)))],
    ids=["default-4", "8-cores", "1-core", "16-cores"],
)
def test_cpu_core_scaling_follows_amdahl(
    make_scenario: Callable[..., Scenario], cores: float, seconds: float
) -> None:
    got = _inference(make_scenario, "w3", [("a", "cpu", cores, 0)], [(0, "w3", "a", 1, 2.0)])
    assert got["a"] == pytest.approx(seconds)


def test_cpu_utilization_slowdown(make_scenario: Callable[..., Scenario]) -> None:
    # two 12-core CPU pods busy on a 24-core node: eta_cpu = 1 -> f = 1 / (1 + 0.5 * 0.3)
    rows = [(0, "w3", "a", 1, 2.0), (0, "w3", "b", 1, 2.0)]
    got = _inference(
        make_scenario,
        "w3",
        [("a", "cpu", 12, 0), ("b", "cpu", 12, 0)],
        rows,
        emulation={"cpuSlowdown": {"eta0": 0.7, "beta": 0.5}},
    )
    base = 20.0 * 2.5 / (1 / (0.2 + 0.8 / 12))
    assert got["a"] == pytest.approx(base * 1.15)


def test_gpu_demand_below_one_leaves_room_for_a_neighbour(
    make_scenario: Callable[..., Scenario],
) -> None:
    lms = [("a", "gpu", 4.0, 1), ("b", "gpu", 4.0, 1)]
    light = _inference(
        make_scenario, "w1", lms, TWO, emulation={"gpuDemand": {"a": 0.3, "b": 0.4}}, name="l"
    )
    assert light == {"a": pytest.approx(30.0), "b": pytest.approx(30.0)}
    mixed = _inference(make_scenario, "w1", lms, TWO, emulation={"gpuDemand": {"a": 0.3}})
    # a gets its 30% and runs at full speed; b gets the other 70% until a is done
    # at 30 s (21 s of work), then its last 9 s alone
    assert mixed == {"a": pytest.approx(30.0), "b": pytest.approx(39.0)}
