"""The emulator never beats the no-queue lower bound the summary reports.

With no service-time jitter every successful request takes at least
uplink + inference + downlink on the best node (`no_queue_lower_bound`), so
each per-LM mean latency is at least its `lower_bound_s`. A bound the
emulator could beat would make "mean latency / lower bound" meaningless.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lmedge.bench.runner import RunSpec, run
from lmedge.controller.assembly import PolicyChoice
from lmedge.sim import load_scenario
from lmedge.sim.network import Network
from lmedge.sim.servicemodel import no_queue_lower_bound

TESTBED = Path(__file__).resolve().parents[2] / "examples" / "testbed"


@pytest.mark.parametrize("policy", ["rr", "ll"])
def test_no_success_is_faster_than_its_bound(policy: str) -> None:
    sc = load_scenario(TESTBED, emulation={"service_time_cv": 0.0})
    out = run(RunSpec(TESTBED, PolicyChoice(policy), 1, 12, keep_history=True), scenario=sc)
    ctx = out.result.context
    net = Network(ctx.nodes)
    ok = [r for r in out.result.measured_records() if r.outcome == "success"]
    assert ok, "the run served something"
    for r in ok:
        bound = no_queue_lower_bound(ctx, net, r.lm, r.origin, r.prompts)
        assert bound is not None and r.latency_s >= bound - 1e-6, r
    for lm in out.summary["per_lm"]:
        if lm["mean_latency_s"] is not None:
            assert lm["lower_bound_s"] is not None
            assert lm["mean_latency_s"] >= lm["lower_bound_s"] - 1e-6
            # The bound is a real quantity: inference of at least one prompt.
            assert lm["lower_bound_s"] >= ctx.service(lm["lm"]).spec.profile.gpu_seconds_per_prompt
