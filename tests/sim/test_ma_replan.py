"""The `ma` deployer and planner when the cluster changes under them (issue 28).

Runs of `examples/churn` (the testbed with a timeline) under the default
profile, each reproducing one failure class the rule deployer had:

- an LMService applied mid-run while every vGPU is taken starts on cores and
  must move to a vGPU once one frees (lm5: ~107 s mean latency when it stayed
  on cores, ~7 s when it moves).
- the first plan, made before any traffic, ran for the whole first epoch
  (a chat LM with a third of the prompts on one node for 50 slots).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from lmedge.bench.runner import RunSpec, run
from lmedge.controller.assembly import PolicyChoice
from lmedge.controller.loop import FIRST_TRAFFIC_SLOTS

ROOT = Path(__file__).resolve().parents[2]
CHURN = ROOT / "examples" / "churn"


@functools.cache
def _churn(policy: str, slots: int) -> Any:
    return run(RunSpec(CHURN, PolicyChoice(policy), 1, slots, keep_history=True))


def _per_lm(policy: str, slots: int) -> dict[str, dict[str, Any]]:
    return {r["lm"]: r for r in _churn(policy, slots).summary["per_lm"]}


def test_an_lm_applied_on_cores_moves_to_a_freed_vgpu() -> None:
    result = _churn("ma", 90).result
    modes = [
        (slot, lm.mode)
        for p, slot in zip(result.placements, result.placement_slots, strict=True)
        for lm in p.lms
        if lm.lm == "lm5" and lm.mode != "off"
    ]
    first = min(slot for slot, _ in modes)
    assert "cpu" in {m for s, m in modes if s == first}, "no vGPU free when lm5 is applied"
    assert any(m == "gpu" for _, m in modes), "lm5 never moved to a vGPU"
    lm5 = _per_lm("ma", 90)["lm5"]
    # On cores a prompt takes ~5 s and the queue grows; on a vGPU 0.4 s.
    assert lm5["mean_latency_s"] < 30.0


def _planner_triggers(policy: str) -> list[tuple[int, str | None]]:
    result = _churn(policy, 5).result
    return [(d.slot, d.trigger) for d in result.decisions if d.agent == "planner"]


def test_the_first_plan_is_remade_once_traffic_is_seen() -> None:
    # The slot-0 plan of a planner that reads traffic has none to read (its prior);
    # after FIRST_TRAFFIC_SLOTS slots with arrivals the loop asks again, once.
    plans = _planner_triggers("ma")
    assert plans[0] == (0, None)
    assert plans[1][0] == FIRST_TRAFFIC_SLOTS
    assert (plans[1][1] or "").startswith("first traffic")
    assert len(plans) == 2
    # A planner that does not read traffic is not asked again: a static one, and the
    # agentic one without `follow_traffic` (mal's profile leaves it off).
    assert _planner_triggers("rr") == [(0, None)]
    assert _planner_triggers("mal") == [(0, None)]
