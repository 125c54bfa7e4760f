"""The scale table (issue 17; run by `make bench`): cost at 10 / 100 / 1,000 workers.

Per size (lmedge.bench.scale.scale_scenario: 16 LMs, the testbed workload):
the controller's serial work per slot (wall and the loop thread's CPU; the
planner, once per epoch, apart) and one node's deployer p95 for every
profile, the agents' prompt tokens, the emulator's time per slot and the
process's peak RSS; then the log-log growth exponent of each column. And
the wall time of a small `reproduce` grid on the local pool vs on a 2-CPU
local Ray head; and the whole loop on examples/metro-1000 with the default
profile (LMEDGE_SCALE_LOOP_SLOTS, default 200: time, CPU, GC share, RSS).
Targets (issue 17 item 2) are printed next to the numbers, not asserted:
this machine is shared, so the ok / over-target flag compares the CPU-time
columns (the loop thread's), which do not count the waits for a core that
inflate wall time under load. Written to reports/bench-scale.json.

LMEDGE_SCALE_SIZES (default 10,100,1000), LMEDGE_SCALE_PROFILES (default:
every registered profile) and LMEDGE_SCALE_SLOTS (default 3; slot 0 runs
the planner) narrow a run.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import time
from pathlib import Path
from typing import Any

import pytest

from lmedge.bench.executors import executor_for
from lmedge.bench.runner import emulated_backend
from lmedge.bench.scale import (
    control_plane_cost,
    growth_exponent,
    measure_control_plane,
    measure_loop,
    metro_scenario,
    peak_rss_mib,
    scale_scenario,
)
from lmedge.controller.catalog import PROFILES
from lmedge.processes.plugins import register_plugins
from lmedge.sim import load_scenario
from tests.fixtures.ray_head import ray_head  # noqa: F401  (the fixture)

pytestmark = pytest.mark.bench

ROOT = Path(__file__).resolve().parents[1]
SERIAL_TARGET_MS = 500.0
DEPLOYER_TARGET_MS = 20.0
RESULTS: dict[str, Any] = {}


def _env_list(name: str, default: str) -> list[str]:
    return [s.strip() for s in os.environ.get(name, default).split(",") if s.strip()]


def _prompt_tokens(path: Path) -> dict[str, int | None]:
    ctx = emulated_backend(load_scenario(path), 1).context()
    try:
        from lmedge.agents.hierarchy import prompt_tokens
    except ImportError:  # the hierarchy's token counter is not in this checkout
        return dict.fromkeys(("planner", "scheduler", "deployer"))
    return {a: prompt_tokens(a, ctx) for a in ("planner", "scheduler", "deployer")}  # type: ignore[arg-type]


@pytest.mark.timeout(7200)  # every profile at 1,000 workers: most of an hour on a loaded machine
def test_scale_table(tmp_path: Path) -> None:
    sizes = [int(s) for s in _env_list("LMEDGE_SCALE_SIZES", "10,100,1000")]
    profiles = _env_list("LMEDGE_SCALE_PROFILES", ",".join(PROFILES))
    slots = int(os.environ.get("LMEDGE_SCALE_SLOTS", "3"))
    rows: list[dict[str, Any]] = []
    sizes_rows: list[dict[str, Any]] = []
    for workers in sorted(sizes):
        path = scale_scenario(tmp_path / f"s{workers}", workers)
        tokens = _prompt_tokens(path)
        scenario = load_scenario(path)  # once: loading 1,000 nodes costs more than a slot
        emulator = []
        for p in profiles:
            cost = control_plane_cost(scenario, p, slots)
            rows.append(cost.row())
            emulator.append(cost.emulator_ms)
            print(cost.row())
        sizes_rows.append(
            {
                "workers": workers,
                "prompt_tokens": tokens,
                "emulator_ms_per_slot": round(min(emulator), 1),
                "peak_rss_mib": round(peak_rss_mib(), 1),
            }
        )
    exponents: dict[str, Any] = {}
    for p in profiles:
        mine = [r for r in rows if r["profile"] == p]
        xs = [r["workers"] for r in mine]
        exponents[p] = {
            k: growth_exponent(xs, [r[k] for r in mine])
            for k in (
                "serial_ms_max",
                "serial_cpu_ms_max",
                "planner_ms",
                "deployer_p95_ms",
                "deployer_cpu_p95_ms",
            )
        }
    xs = [s["workers"] for s in sizes_rows]
    for k in ("emulator_ms_per_slot", "peak_rss_mib"):
        exponents[k] = growth_exponent(xs, [s[k] for s in sizes_rows])
    for agent in ("planner", "scheduler", "deployer"):
        ys = [s["prompt_tokens"][agent] for s in sizes_rows]
        exponents[f"{agent}_tokens"] = None if None in ys else growth_exponent(xs, ys)
    print(
        f"\n{'profile':8} {'workers':>7} {'serial max ms':>13} {'serial cpu ms':>13} "
        f"{'planner ms':>10} {'deployer p95 ms':>15} {'cpu p95 ms':>10}"
    )
    for r in rows:
        flag = (
            "ok"
            if r["serial_cpu_ms_max"] <= SERIAL_TARGET_MS
            and r["deployer_cpu_p95_ms"] <= DEPLOYER_TARGET_MS
            else "over target"
        )
        print(
            f"{r['profile']:8} {r['workers']:>7} {r['serial_ms_max']:>13} "
            f"{r['serial_cpu_ms_max']:>13} {r['planner_ms']:>10} "
            f"{r['deployer_p95_ms']:>15} {r['deployer_cpu_p95_ms']:>10}  "
            f"{flag if r['workers'] >= 1000 else ''}"
        )
    for s in sizes_rows:
        print(s)
    print("growth exponents (log-log slope vs workers):", json.dumps(exponents, indent=1))
    RESULTS["control_plane"] = rows
    RESULTS["sizes"] = sizes_rows
    RESULTS["exponents"] = exponents
    RESULTS["targets"] = {"serial_ms": SERIAL_TARGET_MS, "deployer_p95_ms": DEPLOYER_TARGET_MS}
    assert rows and all(r["serial_ms_max"] > 0 for r in rows)


def test_reproduce_grid_local_vs_ray(ray_head: str) -> None:  # noqa: F811
    from lmedge.bench.grid import Options, plan, specs

    grid = specs(plan(Options(quick=True, policies=("rr", "rf", "ll", "al"))))
    started = time.perf_counter()
    local = executor_for(2, setup=register_plugins).map(grid)
    local_s = time.perf_counter() - started
    started = time.perf_counter()
    remote = executor_for(None, "ray", ray_head, setup=register_plugins).map(grid)
    ray_s = time.perf_counter() - started
    print(f"\nreproduce grid ({len(grid)} runs): local pool of 2 {local_s:.1f} s, "
          f"2-CPU local Ray head {ray_s:.1f} s")  # fmt: skip
    RESULTS["reproduce_grid"] = {"runs": len(grid), "local_2_s": local_s, "ray_2cpu_s": ray_s}
    assert [r.summary for r in remote] == [r.summary for r in local]


def _loop_in_fresh_process(path: Path, slots: int, out: Any) -> None:
    out.put(measure_loop(path, "ma", slots))


@pytest.mark.timeout(3600)  # 200 slots at 1,000 workers plus a baseline epoch, loaded machine
def test_metro_1000_full_loop() -> None:
    """Issue 17 item 4: 1,000 workers x 200 slots, loop + default profile, in a fresh process."""
    slots = int(os.environ.get("LMEDGE_SCALE_LOOP_SLOTS", "200"))
    ctx = multiprocessing.get_context("spawn")
    q = ctx.Queue()
    proc = ctx.Process(
        target=_loop_in_fresh_process, args=(ROOT / "examples" / "metro-1000", slots, q)
    )
    proc.start()
    got: dict[str, float] = q.get()
    proc.join()
    RESULTS["metro_1000_loop"] = got
    print(
        f"\nmetro-1000, ma, {slots} slots: loop {got['loop_wall_s']:.0f} s wall, "
        f"{got['loop_cpu_s']:.0f} s CPU ({100 * got['gc_share']:.0f}% GC), "
        f"peak RSS {got['peak_rss_mib']:.0f} MiB; before it: load {got['load_s']:.0f} s, "
        f"random baseline epoch {got['baseline_s']:.0f} s (targets: 300 s, 2,048 MiB)"
    )
    assert got["requests_in_epochs"] > 0


#: Issue 30 item 4 targets at 10,000 workers (printed, not asserted; see the docstring).
METRO_10K_TARGETS = {"serial_ms": 3000.0, "deployer_p95_ms": 2.0, "tokens": 4000, "rss_mib": 4096.0}


def _control_plane_in_fresh_process(path: Path, slots: int, out: Any) -> None:
    register_plugins()
    out.put(measure_control_plane(path, "ma", slots))


@pytest.mark.timeout(3600)  # generation (once, cached), a ~9 MB load and a few slots
def test_metro_10000_control_plane() -> None:
    """Issue 30 item 4: the metro generator at 10x (10,000 workers, 400 sites,
    80 districts; generated on demand into .lmedge/scenarios), `ma` for
    LMEDGE_SCALE_10K_SLOTS slots (default 2: slot 0 plans, slot 1 is a plain
    one) in a fresh process: serial control-plane time a slot, per-node
    deployer p95, each agent's prompt tokens and the process's peak RSS."""
    slots = int(os.environ.get("LMEDGE_SCALE_10K_SLOTS", "2"))
    path = metro_scenario(10_000, ROOT / ".lmedge" / "scenarios")
    ctx = multiprocessing.get_context("spawn")
    q = ctx.Queue()
    proc = ctx.Process(target=_control_plane_in_fresh_process, args=(path, slots, q))
    proc.start()
    got: dict[str, Any] = q.get()
    proc.join()
    RESULTS["metro_10000_control_plane"] = {**got, "targets": METRO_10K_TARGETS}
    t = METRO_10K_TARGETS
    print(
        f"\nmetro-10000, ma, {slots} slots: serial max {got['serial_ms_max']:.0f} ms wall, "
        f"{got['serial_cpu_ms_max']:.0f} ms CPU (target {t['serial_ms']:.0f}); deployer p95 "
        f"{got['deployer_p95_ms']:.2f} ms, CPU {got['deployer_cpu_p95_ms']:.2f} ms (target "
        f"{t['deployer_p95_ms']}); prompt tokens {got['prompt_tokens']} (target {t['tokens']}); "
        f"peak RSS {got['peak_rss_mib']:.0f} MiB (target {t['rss_mib']:.0f}); load "
        f"{got['load_s']:.0f} s; load average {got['load_average']}"
    )
    assert got["workers"] == 10_000 and got["serial_ms_max"] > 0


def teardown_module() -> None:
    out = ROOT / "reports" / "bench-scale.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(RESULTS, indent=2, sort_keys=True))
