"""What a run costs beyond its measured slots: the settling slots and the random baseline.

`warmup_slots` is what `lmedge simulate` prints before it starts; the
baseline is measured only for a planner that reads it (an LLM's prompt), and
a shorter one over the first slots of the same trace.
"""

from __future__ import annotations

import pytest

from lmedge.api import Capabilities, capabilities_of
from lmedge.bench.runner import (
    RunSpec,
    Warmup,
    baseline_metrics,
    emulated_backend,
    resolve_scenario,
    warmup_slots,
)
from lmedge.controller.assembly import PolicyChoice, build_plugins
from lmedge.errors import ConfigError
from lmedge.processes.plugins import register_plugins
from lmedge.sim import Scenario, load_scenario

TESTBED = resolve_scenario("testbed")


@pytest.fixture(scope="module")
def testbed() -> Scenario:
    register_plugins()
    return load_scenario(TESTBED)


class _ReadsBaseline:
    capabilities = Capabilities(reads_baseline=True)


@pytest.mark.parametrize(
    ("reads", "settle", "warmup", "expected"),
    [
        (True, True, None, Warmup(settle=31, baseline=50)),
        (True, False, 10, Warmup(settle=0, baseline=10)),
        (True, True, 0, Warmup(settle=31, baseline=0)),
        (False, True, None, Warmup(settle=31, baseline=0)),
        (False, True, 10, Warmup(settle=31, baseline=0)),
    ],
    ids=["default", "no-settle-short", "no-baseline", "planner-reads-none", "asked-but-unread"],
)
def test_warmup_counts_the_extra_slots(
    testbed: Scenario, reads: bool, settle: bool, warmup: int | None, expected: Warmup
) -> None:
    ctx = emulated_backend(testbed, 1).context()
    spec = RunSpec(TESTBED, PolicyChoice("ma"), settle=settle, warmup=warmup)
    planner = _ReadsBaseline() if reads else object()
    assert warmup_slots(spec, ctx, planner) == expected


def test_only_the_llm_planner_reads_the_baseline(testbed: Scenario) -> None:
    ctx = emulated_backend(testbed, 1).context()
    rules = build_plugins(PolicyChoice("ma"), ctx, 1).planner
    llm = build_plugins(
        PolicyChoice("ma", params={"planner": {"llm_base_url": "http://127.0.0.1:9/v1"}}), ctx, 1
    ).planner
    assert not capabilities_of(rules).reads_baseline
    assert capabilities_of(llm).reads_baseline


@pytest.mark.parametrize("warmup", [-1, 51], ids=["negative", "over-an-epoch"])
def test_a_bad_warmup_names_the_flag(testbed: Scenario, warmup: int) -> None:
    ctx = emulated_backend(testbed, 1).context()
    with pytest.raises(ConfigError, match=f"--warmup must be between 0 and .* got {warmup}"):
        warmup_slots(RunSpec(TESTBED, PolicyChoice("ma"), warmup=warmup), ctx, _ReadsBaseline())


def test_a_shorter_baseline_is_measured_over_fewer_slots(testbed: Scenario) -> None:
    epoch = baseline_metrics(testbed, 1)
    short = baseline_metrics(testbed, 1, 10)
    assert 0 < short.requests < epoch.requests
    assert baseline_metrics(testbed, 1, 50) == epoch  # an epoch's worth is the epoch
