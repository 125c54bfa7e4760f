"""Every generated scenario validates and runs, its timeline included.

Generated with a 6-slot run length, so node churn, LMServices applied,
edited and deleted, and link shocks all fall inside the few slots run here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from lmedge.bench.runner import RunSpec, run
from lmedge.controller.assembly import PolicyChoice
from lmedge.sim import load_scenario
from lmedge.sim.generator import Bounds, generate, load_pool

ROOT = Path(__file__).resolve().parents[2]
SLOTS = 6


@pytest.fixture(scope="module")
def pool() -> list[dict[str, Any]]:
    return load_pool(ROOT / "examples" / "metro-1000" / "services.yaml")


@pytest.mark.parametrize("seed", range(20))
def test_generated_scenario_loads_and_runs(
    seed: int, pool: list[dict[str, Any]], tmp_path: Path
) -> None:
    folder = generate(seed, pool, Bounds(max_workers=24, slots=SLOTS)).write(tmp_path / "g")
    sc = load_scenario(folder)
    events = sc.timeline.steps[1:] if sc.timeline is not None else ()
    assert all(step.slot >= 1 for step in events)
    # `ma` (the default) with a 3-slot epoch: its baseline epoch and one re-plan inside the run
    spec = RunSpec(
        folder, PolicyChoice("ma"), seed, SLOTS, settle=False, overrides={"loop": {"epochSlots": 3}}
    )
    summary = run(spec).summary
    drawn = yaml.safe_load((folder / "generated.yaml").read_text())
    assert summary["requests"] > 0
    assert sum(summary["outcomes"].values()) == summary["requests"]
    in_force = set(drawn["lms"]["initial"]) | {drawn["lms"]["appliedLater"]} - {None}
    assert {x["lm"] for x in summary["per_lm"] if x["arrivals"]} <= in_force


def test_the_generator_draws_every_kind_of_event(pool: list[dict[str, Any]]) -> None:
    kinds: set[str] = set()
    for seed in range(20):
        drawn = yaml.safe_load(generate(seed, pool, Bounds(slots=SLOTS)).files["generated.yaml"])
        tl = drawn["timeline"]
        kinds |= {k for k in ("applied", "edited", "deleted", "linkShock") if k in tl}
        kinds |= {"deletedNode" if c.get("deleted") else "nodeDown" for c in tl["nodeChurn"]}
        kinds |= {d["origins"] for d in drawn["load"]["demand"]}
        kinds |= {"bottleneck"} if drawn["load"]["bottleneck"] else set()
    assert kinds == {
        "applied",
        "edited",
        "deleted",
        "linkShock",
        "nodeDown",
        "deletedNode",
        "uniform",
        "skewed",
        "hotspot",
        "bottleneck",
    }
