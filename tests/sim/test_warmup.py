"""What a run costs beyond its measured slots: the settling slots and the random baseline.

`warmup_slots` is what `lmedge simulate` prints before it starts; a shorter
baseline is measured over the first slots of the same trace.
"""

from __future__ import annotations

import pytest

from lmedge.bench.runner import (
    RunSpec,
    Warmup,
    baseline_metrics,
    emulated_backend,
    resolve_scenario,
    warmup_slots,
)
from lmedge.controller.assembly import PolicyChoice
from lmedge.errors import ConfigError
from lmedge.processes.plugins import register_plugins
from lmedge.sim import Scenario, load_scenario

TESTBED = resolve_scenario("testbed")


@pytest.fixture(scope="module")
def testbed() -> Scenario:
    register_plugins()
    return load_scenario(TESTBED)


@pytest.mark.parametrize(
    ("policy", "settle", "warmup", "expected"),
    [
        ("ma", True, None, Warmup(settle=31, baseline=50)),
        ("ma", False, 10, Warmup(settle=0, baseline=10)),
        ("ma", True, 0, Warmup(settle=31, baseline=0)),
        ("rr", True, None, Warmup(settle=31, baseline=0)),  # its planner has no use for one
    ],
    ids=["default", "no-settle-short", "no-baseline", "baseline-free-planner"],
)
def test_warmup_counts_the_extra_slots(
    testbed: Scenario, policy: str, settle: bool, warmup: int | None, expected: Warmup
) -> None:
    ctx = emulated_backend(testbed, 1).context()
    spec = RunSpec(TESTBED, PolicyChoice(policy), settle=settle, warmup=warmup)
    assert warmup_slots(spec, ctx) == expected


@pytest.mark.parametrize("warmup", [-1, 51], ids=["negative", "over-an-epoch"])
def test_a_bad_warmup_names_the_flag(testbed: Scenario, warmup: int) -> None:
    ctx = emulated_backend(testbed, 1).context()
    with pytest.raises(ConfigError, match=f"--warmup must be between 0 and .* got {warmup}"):
        warmup_slots(RunSpec(TESTBED, PolicyChoice("ma"), warmup=warmup), ctx)


def test_a_shorter_baseline_is_measured_over_fewer_slots(testbed: Scenario) -> None:
    epoch = baseline_metrics(testbed, 1)
    short = baseline_metrics(testbed, 1, 10)
    assert 0 < short.requests < epoch.requests
    assert baseline_metrics(testbed, 1, 50) == epoch  # an epoch's worth is the epoch
