"""Emulator benchmarks (run by `make bench`): time per run, peak memory, cost per slot.

The driver does what the controller does every slot -- snapshot, arrivals,
routing map, placements, advance the clock, drain records -- with trivial
decisions (a static full placement, routes rotating over feasible nodes), so
the numbers are the emulator's own cost. Results are printed and written to
reports/bench-sim.json.
"""

from __future__ import annotations

import gc
import json
import time
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from lmedge.api import LMPlacement, Placement, Route, RoutingMap, nearest_feasible
from lmedge.backends.emulated import EmulatedBackend, load_scenario
from lmedge.sim.synthetic import synthetic_cluster, write_scenario

pytestmark = pytest.mark.bench

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
RESULTS: dict[str, Any] = {}


def drive(backend: EmulatedBackend, slots: int) -> int:
    """Run `slots` slots with static decisions; return the number of records."""
    ctx = backend.context()
    for n in ctx.workers:
        gpu = n.spec.has_gpu
        lms = [
            LMPlacement(lm=s.name, mode="gpu" if gpu else "cpu", cpu_cores=2, vgpus=int(gpu))
            for s in ctx.services
        ]
        backend.apply_placement(nearest_feasible(Placement(node=n.name, lms=lms), n, ctx.services))
    feasible = {lm: ctx.feasible_nodes(lm) for lm in ctx.lm_names}
    records = 0
    for t in range(slots):
        backend.snapshot(t)
        arrivals = backend.arrivals(t)
        routes = [
            Route(
                origin=a.origin, lm=a.lm, destination=feasible[a.lm][(t + k) % len(feasible[a.lm])]
            )
            for k, a in enumerate(arrivals)
        ]
        backend.publish_routing(t, RoutingMap(routes=routes))
        backend.clock.sleep_until((t + 1) * ctx.slot_s)
        records += len(backend.drain_records())
    return records


def _timed(path: Path, slots: int) -> tuple[float, int]:
    backend = EmulatedBackend(load_scenario(path), seed=0)
    gc.collect()  # earlier runs' cyclic garbage would otherwise be traversed on our clock
    t0 = time.process_time()
    n = drive(backend, slots)
    return time.process_time() - t0, n


def _peak_mib(path: Path, slots: int) -> float:
    tracemalloc.start()
    try:
        drive(EmulatedBackend(load_scenario(path), seed=0), slots)
        return tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize(("name", "budget_s"), [("testbed", 3.0), ("large", 60.0)])
def test_200_slots(name: str, budget_s: float) -> None:
    cpu_s, records = _timed(EXAMPLES / name, 200)
    peak = _peak_mib(EXAMPLES / name, 200)
    RESULTS[f"{name}-200-slots"] = {
        "cpu_s": round(cpu_s, 3),
        "records": records,
        "peak_mib": round(peak, 1),
    }
    print(f"\n{name}: 200 slots in {cpu_s:.2f} s CPU, {records} records, peak {peak:.1f} MiB")
    assert cpu_s < budget_s


@pytest.mark.parametrize("workers", [10, 100, 1000])
def test_cost_per_slot(tmp_path: Path, workers: int) -> None:
    folder = write_scenario(
        tmp_path / f"w{workers}",
        synthetic_cluster(workers, sites=max(1, workers // 30)),
        EXAMPLES / "testbed" / "services.yaml",
    )
    slots = 40 if workers >= 1000 else 100
    cpu_s, _ = _timed(folder, slots)
    per_slot_ms = 1000 * cpu_s / slots
    RESULTS[f"per-slot-{workers}-workers"] = {"ms_per_slot": round(per_slot_ms, 2), "slots": slots}
    print(f"\n{workers} workers: {per_slot_ms:.1f} ms per slot ({slots} slots)")
    assert per_slot_ms < 30 * workers  # far below real time (30 s per slot) at any size


def teardown_module() -> None:
    out = ROOT / "reports" / "bench-sim.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(RESULTS, indent=2) + "\n")
