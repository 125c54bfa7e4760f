"""Seeded golden summaries of the `testbed` scenario under the RR and RF baselines,
and of the `churn` scenario (testbed + a timeline of cluster events) under RR and MA.

The whole path runs: scenario files -> emulator -> control loop with the
catalog's plugins -> `lmedge.metrics` -> the `simulate --json` summary. A
golden file changes only when behaviour changes; after an intended change,
regenerate them with

    LMEDGE_REGEN_GOLDEN=1 .venv/bin/pytest tests/sim/test_golden.py

and review the diff like code.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

import pytest

from lmedge.bench.runner import RunSpec, run
from lmedge.bench.summary import dumps
from lmedge.controller.assembly import PolicyChoice
from lmedge.sim import load_scenario

ROOT = Path(__file__).resolve().parents[2]
TESTBED = ROOT / "examples" / "testbed"
CHURN = ROOT / "examples" / "churn"
CHURN_SLOTS = 200  # the timeline's last event is at slot 180
GOLDEN = Path(__file__).parent / "golden"
REGEN = os.environ.get("LMEDGE_REGEN_GOLDEN") == "1"
SLOTS = 100
SEED = 1


def fresh_summary(policy: str, seed: int = SEED) -> str:
    return dumps(run(RunSpec(TESTBED, PolicyChoice(policy), seed, SLOTS)).summary)


@functools.cache
def summary_text(policy: str, seed: int = SEED) -> str:
    return fresh_summary(policy, seed)


@pytest.mark.parametrize("policy", ["rr", "rf"])
def test_golden_summary(policy: str) -> None:
    path = GOLDEN / f"controller-testbed-{policy}-s{SEED}-{SLOTS}.json"
    text = summary_text(policy)
    if REGEN:
        path.write_text(text)
    assert path.exists(), f"missing {path}; run with LMEDGE_REGEN_GOLDEN=1 to create it"
    assert text == path.read_text()


@functools.cache
def churn_text(policy: str) -> str:
    return dumps(run(RunSpec(CHURN, PolicyChoice(policy), SEED, CHURN_SLOTS)).summary)


@pytest.mark.parametrize("policy", ["rr", "ma"])
def test_churn_golden_summary(policy: str) -> None:
    path = GOLDEN / f"controller-churn-{policy}-s{SEED}-{CHURN_SLOTS}.json"
    text = churn_text(policy)
    if REGEN:
        path.write_text(text)
    assert path.exists(), f"missing {path}; run with LMEDGE_REGEN_GOLDEN=1 to create it"
    assert text == path.read_text()
    summary = json.loads(text)
    # the timeline stranded requests on both counts, and every one has an outcome
    assert summary["outcomes"]["node_lost"] > 0
    assert summary["outcomes"]["lm_removed"] > 0
    assert sum(summary["outcomes"].values()) == summary["requests"]
    assert [x["lm"] for x in summary["per_lm"]] == ["lm1", "lm2", "lm3", "lm4", "lm5"]


def test_same_seed_same_bytes_other_seed_other_numbers() -> None:
    a, b, c = summary_text("rr"), fresh_summary("rr"), summary_text("rr", seed=2)
    assert a == b
    assert a != c


def test_policies_see_the_same_trace() -> None:
    """RR and RF differ in decisions only: the arrivals per LM are identical."""
    rr, rf = (json.loads(summary_text(p)) for p in ("rr", "rf"))
    assert [x["arrivals"] for x in rr["per_lm"]] == [x["arrivals"] for x in rf["per_lm"]]
    assert rr["reconfiguration"]["activations_per_100"] > 0
    # RF starts every LM wherever it fits once and never stops one: its only
    # (actuated) events are those first starts, at most one per (node, LM).
    ctx = load_scenario(TESTBED).context()
    rf_reconf = rf["reconfiguration"]
    assert rf_reconf["deactivations_per_100"] == 0
    for row in rf_reconf["per_lm"]:
        assert 0 < row["activations"] <= len(ctx.feasible_nodes(row["lm"]))
    assert rf_reconf["activations_per_100"] < rr["reconfiguration"]["activations_per_100"]
