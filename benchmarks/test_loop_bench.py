"""Control-loop benchmarks (run by `make bench`): whole runs, store writes included.

- `testbed`, 200 slots, RR, pinned to one core, writing every decision,
  request record and telemetry snapshot to a fresh embedded store: the
  target is under 10 s end to end (scenario load to store close);
- `large` (120 workers), 200 slots, RR, same store: time and the process's
  peak resident memory (`ru_maxrss`; tracemalloc would triple the run time).

Settling is off so the slot count is exactly 200. Numbers are printed and
written to reports/bench-loop.json.
"""

from __future__ import annotations

import json
import os
import resource
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lmedge.bench.runner import RunSpec, run
from lmedge.controller.assembly import PolicyChoice
from lmedge.store import open_store

pytestmark = pytest.mark.bench

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
SLOTS = 200
TESTBED_TARGET_S = 10.0
RESULTS: dict[str, Any] = {}


@pytest.fixture(scope="module", autouse=True)
def _write_results() -> Iterator[None]:
    yield
    out = ROOT / "reports" / "bench-loop.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(RESULTS, indent=2) + "\n")
    print(f"\nloop benchmark results: {out}")


@pytest.fixture
def one_core() -> Iterator[None]:
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(before)})
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def _timed_run(scenario: Path, store_dir: Path) -> dict[str, Any]:
    started = time.perf_counter()
    store = open_store(str(store_dir))
    outcome = run(RunSpec(scenario, PolicyChoice("rr"), 1, SLOTS, settle=False), store=store)
    store.close()
    total = time.perf_counter() - started
    return {
        "slots": SLOTS,
        "total_s": round(total, 3),
        "loop_s": outcome.timing["wall_s"],
        "store_s": outcome.timing["store_s_total"],
        "decide_ms_per_slot_mean": round(outcome.timing["decide_s_per_slot_mean"] * 1000, 3),
        "requests": len(outcome.result.records),
        "decisions": len(outcome.result.decisions),
    }


def test_testbed_200_slots_on_one_core_with_store(one_core: None, tmp_path: Path) -> None:
    r = _timed_run(EXAMPLES / "testbed", tmp_path / "store")
    RESULTS["testbed"] = r
    print(f"\ntestbed, {SLOTS} slots, one core, embedded store: {r}")
    assert r["total_s"] < TESTBED_TARGET_S, r


def test_large_200_slots_time_and_peak_memory(tmp_path: Path) -> None:
    scenario = EXAMPLES / "large"
    if not scenario.is_dir():
        pytest.fail(f"{scenario} is missing")
    r = _timed_run(scenario, tmp_path / "store")
    r["peak_rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    RESULTS["large"] = r
    print(f"\nlarge, {SLOTS} slots, embedded store: {r}")
