"""The scale table's accounting: per-node time, the serial rest, growth exponents."""

from __future__ import annotations

import gc
import math

import pytest

from lmedge.bench.runner import emulated_backend, resolve_scenario
from lmedge.bench.scale import GCTimer, growth_exponent
from lmedge.controller.assembly import PolicyChoice, build_plugins
from lmedge.controller.loop import ControlLoop
from lmedge.sim import load_scenario


@pytest.mark.parametrize("profile", ["ma", "rl"])
def test_each_node_is_timed_once_and_the_serial_part_is_what_is_left(profile: str) -> None:
    backend = emulated_backend(load_scenario(resolve_scenario("testbed")), 1)
    ctx = backend.context()
    loop = ControlLoop(backend, build_plugins(PolicyChoice(profile), ctx, 1), run_id="t")
    for t in range(3):
        loop.step(t)
    loop.close()
    deployers = [d for d in loop.result.decisions if d.agent == "deployer"]
    for t in loop.result.timings:
        # one whole guarded decision per worker, each at least its plugin call
        assert len(t.node_s) == len(ctx.workers)
        assert len(t.node_cpu_s) == len(ctx.workers)
        assert t.deployers_s == pytest.approx(sum(t.node_s))
        mine = [d for d in deployers if d.slot == t.slot]  # node order, as node_s
        assert [d.node for d in mine] == [n.name for n in ctx.workers]
        assert all(d.latency_s <= s for d, s in zip(mine, t.node_s, strict=True))
        assert t.decide_s >= t.deployers_s + t.planner_s + t.router_s - 1e-9
        assert 0 <= t.deployers_cpu_s <= t.decide_cpu_s
    assert loop.result.timings[0].planner_s > 0  # slot 0 plans


def test_growth_exponent_is_the_log_log_slope() -> None:
    xs = [10, 100, 1000]
    assert growth_exponent(xs, [x**2 for x in xs]) == pytest.approx(2.0)
    assert growth_exponent(xs, [5.0, 5.0, 5.0]) == pytest.approx(0.0)
    assert growth_exponent(xs, [3 * math.sqrt(x) for x in xs]) == pytest.approx(0.5)
    assert growth_exponent([10], [1.0]) is None  # one point has no slope
    assert growth_exponent([10, 100], [0.0, 1.0]) is None  # a zero has no logarithm
    assert growth_exponent([10, 10], [1.0, 2.0]) is None  # no spread in x


def test_gc_timer_counts_collections_in_its_block_and_unhooks_itself() -> None:
    with GCTimer() as timer:
        gc.collect()
    assert timer.cpu_s >= 0.0
    assert timer._on_gc not in gc.callbacks
    seen = timer.cpu_s
    gc.collect()  # outside the block: not counted
    assert timer.cpu_s == seen
    with pytest.raises(RuntimeError), GCTimer() as failing:
        raise RuntimeError("the block failed")
    assert failing._on_gc not in gc.callbacks
