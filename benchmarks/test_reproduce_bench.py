"""`lmedge reproduce` benchmark (run by `make bench`): lmedge's targets, and the cost.

Runs the testbed part of the reproduction (every profile, seeds 1-3, 200
slots, on a process pool of one worker per core) and prints:

1. the performance targets of issue 11, as `lmedge reproduce` evaluates them:
   MA's LM-mean latency reduction vs PerLLM (>= 45%), MILP (>= 57%) and RF
   (>= 80%), MA's Jain (>= 0.95), and mean latency over the no-queue lower
   bound per LM. They are reported, met or missed, not asserted: they are
   claims about the policies, which this benchmark measures, not enforces;
2. the CPU seconds per run and per slot of each profile, and from them an
   estimate of the whole `lmedge reproduce` grid on 2 idle cores. CPU time
   (not wall time) is measured so the estimate holds on a loaded machine;
   the target is <= 10 minutes, which is asserted.

Results are written to reports/bench-reproduce.json.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import pytest

from lmedge.bench.evaluation import evaluate
from lmedge.bench.executors import executor_for
from lmedge.bench.grid import Options, plan, specs
from lmedge.processes.plugins import register_plugins

pytestmark = pytest.mark.bench

ROOT = Path(__file__).resolve().parents[1]
REPORT = ROOT / "reports" / "bench-reproduce.json"
#: The whole reproduction on a 2-core machine must finish within this (issue 11).
BUDGET_S = 600.0


@pytest.mark.timeout(1800)  # 33 runs: minutes on a loaded 2-core machine
def test_testbed_targets_and_the_cost_of_the_whole_grid() -> None:
    full = plan(Options())
    testbed = [e for e in full if e.scenario == "testbed"]
    started = time.perf_counter()
    runs = executor_for(os.cpu_count(), setup=register_plugins).map(specs(testbed))
    wall = time.perf_counter() - started
    sections, _ = evaluate(testbed, runs)
    targets = next(s for s in sections if s.key == "targets")

    print("\n== lmedge's targets on the testbed (seeds 1-3, 200 slots) ==")
    for t in targets.tables:
        print(f"-- {t.title}")
        widths = [max(len(str(r[i])) for r in (t.header, *t.rows)) for i in range(len(t.header))]
        for row in (t.header, *t.rows):
            print("  " + "  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)))
    for c in targets.checks:
        verdict = {True: "met", False: "MISSED", None: "not measured"}[c.holds]
        print(f"  [{verdict}] {c.claim}: {c.reason}")

    # CPU per measured-and-settle slot, per profile, from the testbed runs.
    per_slot: dict[str, float] = {}
    for p in testbed[0].policies:
        mine = [r for r in runs if r.summary["policy"] == p]
        per_slot[p] = statistics.fmean(
            r.timing["cpu_s"] / (r.summary["slots"] + r.summary["settle_slots"]) for r in mine
        )
    settle = runs[0].summary["settle_slots"]
    estimate_cpu = sum(
        per_slot.get(s.choice.profile or "", max(per_slot.values())) * ((s.slots or 0) + settle)
        for s in specs(full)
    )
    longest = max(per_slot.values()) * (full[-1].slots + settle)
    estimate_2 = max(estimate_cpu / 2, longest)
    print("\n== cost ==")
    for p, v in per_slot.items():
        print(f"  {p:8s} {1000 * v:7.1f} ms CPU per slot")
    print(
        f"  testbed part: {len(runs)} runs, {sum(r.timing['cpu_s'] for r in runs):.0f} CPU-s, "
        f"wall {wall:.0f} s on {os.cpu_count()} cores (load {os.getloadavg()[0]:.1f})"
    )
    print(
        f"  whole grid ({len(specs(full))} runs): ≈ {estimate_cpu:.0f} CPU-s, "
        f"≈ {estimate_2:.0f} s on 2 idle cores (budget {BUDGET_S:.0f} s)"
    )
    REPORT.parent.mkdir(exist_ok=True)
    result: dict[str, Any] = {
        "targets": [
            {"claim": c.claim, "holds": c.holds, "reason": c.reason} for c in targets.checks
        ],
        "cpu_s_per_slot": per_slot,
        "testbed_wall_s": wall,
        "grid_cpu_s_estimate": estimate_cpu,
        "grid_wall_s_estimate_2_cores": estimate_2,
    }
    REPORT.write_text(json.dumps(result, indent=2) + "\n")
    assert estimate_2 <= BUDGET_S, f"the whole grid needs ≈ {estimate_2:.0f} s on 2 cores"
