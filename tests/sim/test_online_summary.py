"""A run's summary computed as it goes equals the one its full history gives.

`lmedge simulate` keeps no per-request history (`RunTally`); these runs keep
it too (`keep_history=True`) and compare, field by field, the online summary
with the one replayed from the history afterwards, on the shipped examples
at a short slot count. Stranding and lower bounds are also checked against
the batch functions of `lmedge.metrics` and `servicemodel`, which the online
path does not use. The one intended difference: a request is bounded in the
context in force when it ran, so an LM a timeline adds has a bound online
and none from the slot-0 context.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import pytest

from lmedge.bench.runner import RunSpec, run
from lmedge.bench.summary import DIGITS, routing_summary, summarize
from lmedge.bench.tally import QuantileTally
from lmedge.controller.assembly import PolicyChoice
from lmedge.metrics import stranded_requests
from lmedge.sim.servicemodel import lower_bounds

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
CASES = [
    ("testbed", "ma", 20),
    ("testbed", "rr", 20),
    ("churn", "ma", 70),  # lm5 is applied at slot 60
    ("bursty", "ll", 12),
    ("llm-edge", "ma", 10),  # token-level records
    ("model-routing", "cema", 12),  # request classes
]


def _diff(a: Any, b: Any, path: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in a.keys() | b.keys() for d in _diff(a.get(k), b.get(k), f"{path}.{k}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [
            d
            for i, (x, y) in enumerate(zip(a, b, strict=True))
            for d in _diff(x, y, f"{path}[{i}]")
        ]
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


@pytest.mark.parametrize(
    ("example", "policy", "slots"), CASES, ids=[f"{e}-{p}" for e, p, _ in CASES]
)
def test_the_online_summary_is_the_history_summary(example: str, policy: str, slots: int) -> None:
    out = run(RunSpec(EXAMPLES / example, PolicyChoice(policy), 1, slots, keep_history=True))
    result, ctx = out.result, out.result.context
    online = out.summary
    replayed = summarize(
        result,
        scenario=online["scenario"],
        seed=1,
        components=online["components"],
        kv_gib_s=online.get("tokens", {}).get("kv_gib_s"),
    )
    # the runner's additions, from the same history
    energy = QuantileTally()
    for r in result.measured_records():
        if r.energy_j is not None:
            energy.add(r.energy_j)
    replayed["routing"] = routing_summary(energy)
    if "balance" in online:  # token-level runs: LYREO's latency over the successes
        ok = [r.latency_s for r in result.measured_records() if r.outcome == "success"]
        assert online["balance"]["mean_latency_s"] == round(statistics.fmean(ok), DIGITS)
        del online["balance"]
    known = {*ctx.lm_names, *ctx.request_classes}
    added = [x["lm"] for x in online["per_lm"] if x["lm"] not in known]
    for row in online["per_lm"]:
        if row["lm"] in added:  # bounded in the context that has it
            assert row["lower_bound_s"] is not None
            row["lower_bound_s"] = None
    assert _diff(online, replayed) == []
    assert online["requests"] > 0 and sum(online["outcomes"].values()) == online["requests"]

    records = result.measured_records()
    deadlines = {lm: ctx.deadline_s(lm) for lm in ctx.lm_names}
    stranded = stranded_requests(
        records, result.actuations, result.placement_slots, deadlines, ctx.loop.slot_s
    )
    assert online["stranded"] == len(stranded)
    bounds = lower_bounds(ctx, records, [x["lm"] for x in online["per_lm"]])
    assert [round(v, 6) if v is not None else None for v in bounds.values()] == [
        x["lower_bound_s"] for x in online["per_lm"]
    ]


def test_a_run_without_history_keeps_none() -> None:
    out = run(RunSpec(EXAMPLES / "testbed", PolicyChoice("rr"), 1, 12))
    result = out.result
    assert result.records == [] and result.actuations == [] and result.decisions == []
    assert out.summary["requests"] > 0 and out.summary["audit"]
