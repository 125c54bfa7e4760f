"""Emulator benchmarks (run by `make bench`): time per run, peak memory, cost per slot.

The driver does what the controller does every slot -- snapshot, arrivals,
routing map, placements, advance the clock, drain records -- with trivial
decisions (a static full placement, routes rotating over feasible nodes), so
the numbers are the emulator's own cost. Results are printed and written to
reports/bench-sim.json.

`measure_emulator(path, slots)` is the helper the scale table calls: CPU
seconds, the share of them spent in Python's cyclic GC, and the peak RSS of a
fresh process, for the emulator alone (10 / 100 / 1,000 workers here; the
1,000-worker point is `examples/metro-1000`).
"""

from __future__ import annotations

import gc
import json
import multiprocessing
import resource
import time
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from lmedge.api import LMPlacement, Placement, Route, RoutingMap, nearest_feasible
from lmedge.backends.emulated import EmulatedBackend, load_scenario
from lmedge.bench.scale import GCTimer
from lmedge.sim.synthetic import synthetic_cluster, write_scenario

pytestmark = pytest.mark.bench

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
RESULTS: dict[str, Any] = {}


def place_everything(backend: EmulatedBackend) -> None:
    """A static placement: every LM wherever it fits (the nearest feasible full placement)."""
    ctx = backend.context()
    for n in ctx.workers:
        gpu = n.spec.has_gpu
        lms = [
            LMPlacement(lm=s.name, mode="gpu" if gpu else "cpu", cpu_cores=2, vgpus=int(gpu))
            for s in ctx.services
        ]
        backend.apply_placement(nearest_feasible(Placement(node=n.name, lms=lms), n, ctx.services))


def drive(backend: EmulatedBackend, slots: int, *, place: bool = True) -> int:
    """Run `slots` slots with static decisions; return the number of records."""
    if place:
        place_everything(backend)
    ctx = backend.context()
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


def _measure(path: Path, slots: int, out: Any) -> None:
    backend = EmulatedBackend(load_scenario(path), seed=0)
    place_everything(backend)  # the driver's set-up, not the emulator's cost
    gc.collect()
    with GCTimer() as gc_time:
        t0 = time.process_time()
        records = drive(backend, slots, place=False)
        cpu_s = time.process_time() - t0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    out.put({"cpu_s": cpu_s, "gc_s": gc_time.cpu_s, "records": records, "rss_mib": rss})


def measure_emulator(path: Path, slots: int) -> dict[str, float]:
    """Emulator cost in a fresh process (so RSS is this run's): cpu_s, ms_per_slot,
    gc_share (of cpu_s), rss_mib (peak), records."""
    ctx = multiprocessing.get_context("spawn")
    q = ctx.Queue()
    proc = ctx.Process(target=_measure, args=(path, slots, q))
    proc.start()
    got: dict[str, float] = q.get()
    proc.join()
    got["ms_per_slot"] = 1000 * got["cpu_s"] / slots
    got["gc_share"] = got["gc_s"] / got["cpu_s"] if got["cpu_s"] else 0.0
    return got


@pytest.mark.parametrize(("workers", "slots"), [(10, 50), (100, 20), (1000, 10)])
def test_emulator_time_gc_and_rss(tmp_path: Path, workers: int, slots: int) -> None:
    """Emulator CPU per slot, GC share and peak RSS at 10 / 100 / 1,000 workers (metro-1000)."""
    if workers == 1000:
        folder = EXAMPLES / "metro-1000"
    else:
        folder = write_scenario(
            tmp_path / f"w{workers}",
            synthetic_cluster(workers, sites=max(1, workers // 25)),
            EXAMPLES / "testbed" / "services.yaml",
        )
    m = measure_emulator(folder, slots)
    RESULTS[f"emulator-{workers}-workers"] = {k: round(v, 3) for k, v in m.items()} | {
        "slots": slots
    }
    print(
        f"\n{workers} workers: {m['ms_per_slot']:.0f} ms/slot, GC {100 * m['gc_share']:.0f}%, "
        f"peak RSS {m['rss_mib']:.0f} MiB, {m['records']:.0f} records ({slots} slots)"
    )
    # issue 17: 1,000 workers x 200 slots within 5 min and 2 GiB (the emulator's share of it)
    assert m["rss_mib"] < 2048
    if workers == 1000:
        assert m["ms_per_slot"] * 200 < 300_000


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
