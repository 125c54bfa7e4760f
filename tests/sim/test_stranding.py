"""No stranded requests: work queued at a node is served there, or its LM keeps being wanted.

A request routed to a node where its LM is never started (or never started
again) can only wait out its deadline. The rule agents guarantee that cannot
happen (lmedge/agents/README.md, "Rule backends"); these runs cross an epoch
boundary, where the planner moves roles and the old deployer/router
interplay used to strand whole queues (a running LM fed forever, its node's
new role never started).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lmedge.api import ActuationResult, RequestRecord
from lmedge.bench.runner import RunSpec, run
from lmedge.controller.assembly import PolicyChoice
from lmedge.metrics import stranded_requests

TESTBED = Path(__file__).parents[2] / "examples" / "testbed"


def _stranded(profile: str, seed: int, slots: int) -> tuple[list[RequestRecord], int]:
    out = run(RunSpec(TESTBED, PolicyChoice(profile), seed=seed, slots=slots, keep_history=True))
    result, ctx = out.result, out.result.context
    records = result.measured_records()
    found = stranded_requests(
        records,
        result.actuations,
        result.placement_slots,
        {lm: ctx.deadline_s(lm) for lm in ctx.lm_names},
        ctx.loop.slot_s,
    )
    return found, len(records)


@pytest.mark.parametrize("profile", ["ma", "mal"])
def test_rule_agents_strand_no_request_across_an_epoch_boundary(profile: str) -> None:
    found, total = _stranded(profile, seed=1, slots=60)
    assert total > 1000
    assert [(r.id, r.destination) for r in found] == []


def test_stranded_requests_are_found_from_actuations() -> None:
    def rec(rid: str, lm: str, dest: str, slot: int, outcome: str = "timeout") -> RequestRecord:
        return RequestRecord.model_validate(
            {
                "id": rid,
                "lm": lm,
                "origin": "a",
                "destination": dest,
                "prompts": 2,
                "slot": slot,
                "submit_s": slot * 30.0,
                "outcome": outcome,
            }
        )

    actuations = [
        ActuationResult(node="w1", started=["lm1"]),  # slot 0
        ActuationResult(node="w1", stopped=["lm1"]),  # slot 1: never again
        ActuationResult(node="w2", started=["lm2"]),  # slot 5
    ]
    records = [
        rec("served-later", "lm2", "w2", 0),  # lm2 runs on w2 before its deadline
        rec("stranded", "lm1", "w1", 2),  # lm1 stopped on w1 for good
        rec("elsewhere", "lm2", "w1", 3),  # lm2 never ran on w1
        rec("refused", "lm1", "w1", 2, outcome="rejected"),
    ]
    found = stranded_requests(records, actuations, [0, 1, 5], {"lm1": 90.0, "lm2": 900.0}, 30.0)
    assert [r.id for r in found] == ["stranded", "elsewhere"]
