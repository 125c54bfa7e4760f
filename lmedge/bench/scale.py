"""The scale table: control-plane and emulator cost at 10 / 100 / 1,000 workers.

`scale_scenario` writes a synthetic scenario of any size (Table I's hardware
mix over `sites` sites, the testbed's four LM types in four sizes each, the
testbed's workload: ~14,000 requests a slot at 1,000 workers), so the
columns grow along one axis only. `control_plane_cost` runs the real
control loop on it and splits each slot's decision time into

- the *serial* part: snapshot, arrivals, router, validation, publication
  and the loop's own work -- what one controller does per slot,
  `decide_s - deployers_s - planner_s`, as wall time and as the loop
  thread's CPU time (on a loaded machine the wall time also counts waits
  for a core);
- the *planner*, once per epoch (slot 0 here), reported on its own: on a
  cluster it plans in a background thread (`background_planning`), off
  the slot path;
- the *per-node* part: each node's whole guarded deployer decision (call,
  validation, repair; `SlotTiming.node_s`), which on a cluster each node
  agent does for its own node, in parallel.

`growth_exponent` is the log-log least-squares slope of a column against the
worker count (1 = linear). Nothing here asserts a target; the benchmark
prints the table next to the targets (benchmarks/test_scale_bench.py).
"""

from __future__ import annotations

import copy
import gc
import math
import os
import resource
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from lmedge.bench.runner import emulated_backend, resolve_scenario
from lmedge.controller.assembly import PolicyChoice, build_plugins
from lmedge.controller.gctune import quiet_gc
from lmedge.controller.loop import ControlLoop
from lmedge.sim import Scenario, load_scenario
from lmedge.sim.synthetic import scenario_doc, synthetic_cluster, write_scenario

#: LM sizes: factors on the testbed LMs' service times and memory (4 types x 4 = 16 LMs).
SIZES: dict[str, float] = {"s": 0.5, "m": 1.0, "l": 1.5, "xl": 2.0}
#: Workers per site in the synthetic scenarios (1,000 workers: 40 sites).
WORKERS_PER_SITE = 25


def scale_scenario(folder: Path, workers: int, sites: int | None = None) -> Path:
    """Write a `workers`-worker scenario with 16 LMs into `folder` (see the module docstring)."""
    testbed = resolve_scenario("testbed")
    base = yaml.safe_load((testbed / "scenario.yaml").read_text())
    services = []
    for doc in yaml.safe_load_all((testbed / "services.yaml").read_text()):
        if not doc:
            continue
        for size, factor in SIZES.items():
            svc = copy.deepcopy(doc)
            svc["metadata"]["name"] = f"{doc['metadata']['name']}-{size}"
            spec, profile = svc["spec"], svc["spec"]["profile"]
            for key in ("gpuSecondsPerPrompt", "cpuSecondsPerPrompt"):
                if key in profile:
                    profile[key] = round(profile[key] * factor, 3)
            for key in ("minMemoryGib", "deploymentMemoryGib", "minVramGib"):
                spec[key] = round(spec[key] * factor, 3)
            services.append(svc)
    n_sites = sites or max(1, workers // WORKERS_PER_SITE)
    doc = scenario_doc(
        f"scale-{workers}",
        description=f"{workers} workers over {n_sites} sites, 16 LMs (lmedge.bench.scale)",
        loop=base["loop"],
        emulation=base["emulation"],
        workload=base["workload"],
    )
    return write_scenario(folder, synthetic_cluster(workers, n_sites), services, scenario=doc)


#: The metro generator (a source checkout's tools/); examples/metro-1000 is its output.
METRO_GENERATOR = Path(__file__).resolve().parents[2] / "tools" / "make-metro-scenario.py"
#: Where generated metro scenarios are cached (ignored by git: .lmedge/).
METRO_CACHE = Path(".lmedge") / "scenarios"


def metro_scenario(workers: int, cache: Path = METRO_CACHE) -> Path:
    """examples/metro-1000's generator at `workers` workers, generated once and cached.

    The shape scales with the workers: 25 a site and 5 sites a district, as
    metro-1000 (40 sites, 8 districts); same arguments, same bytes, so a
    cached folder is reused. At 10,000 workers the files are tens of MB:
    generated on demand, never committed.
    """
    sites = max(1, workers // WORKERS_PER_SITE)
    districts = max(1, sites // 5)
    out = cache / f"metro-{workers}"
    if not (out / "scenario.yaml").is_file():
        import subprocess
        import sys

        if not METRO_GENERATOR.is_file():
            raise FileNotFoundError(f"the metro generator is not at {METRO_GENERATOR}")
        tmp = cache / ".partial" / out.name  # the folder's name is the scenario's
        tmp.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [sys.executable, str(METRO_GENERATOR), "--workers", str(workers),
             "--sites", str(sites), "--districts", str(districts), "--out", str(tmp)],
            check=True,
        )  # fmt: skip
        tmp.replace(out)  # a crash mid-generation leaves no half folder to reuse
    return out


@dataclass(frozen=True)
class ControlCost:
    """One profile's decision cost on one scenario (milliseconds)."""

    profile: str
    workers: int
    slots: int
    serial_ms: list[float]  # per slot, wall
    serial_cpu_ms: list[float]  # per slot, the loop thread's CPU
    deployer_p95_ms: float
    deployer_cpu_p95_ms: float
    planner_ms: float
    router_ms: float  # mean over slots
    emulator_ms: float  # per slot: the clock advance (the emulator's events)

    @property
    def serial_max_ms(self) -> float:
        return max(self.serial_ms)

    def row(self) -> dict[str, Any]:
        return {
            "profile": self.profile,
            "workers": self.workers,
            "slots": self.slots,
            "serial_ms_max": round(self.serial_max_ms, 1),
            "serial_ms_median": round(statistics.median(self.serial_ms), 1),
            "serial_cpu_ms_max": round(max(self.serial_cpu_ms), 1),
            "planner_ms": round(self.planner_ms, 1),
            "router_ms": round(self.router_ms, 1),
            "deployer_p95_ms": round(self.deployer_p95_ms, 3),
            "deployer_cpu_p95_ms": round(self.deployer_cpu_p95_ms, 3),
            "emulator_ms_per_slot": round(self.emulator_ms, 1),
        }


def control_plane_cost(
    path: Path | Scenario, profile: str, slots: int, seed: int = 1
) -> ControlCost:
    """Run `profile` for `slots` slots on `path` (slot 0 includes the planner).

    Give a loaded `Scenario` to time several profiles on one: loading a
    1,000-node scenario takes longer than a few slots of most profiles.
    """
    scenario = path if isinstance(path, Scenario) else load_scenario(path)
    backend = emulated_backend(scenario, seed)
    ctx = backend.context()
    loop = ControlLoop(
        backend, build_plugins(PolicyChoice(profile), ctx, seed), run_id="scale", seed=seed
    )
    walls = []
    with quiet_gc():  # as `ControlLoop.run` and the controller run it
        for t in range(slots):
            started = time.perf_counter()
            loop.step(t)
            walls.append(time.perf_counter() - started)
    loop.close()
    timings = loop.result.timings
    p95 = _p95([s for t in timings for s in t.node_s])
    cpu_p95 = _p95([s for t in timings for s in t.node_cpu_s])
    emulator = [w - t.decide_s - t.store_s for w, t in zip(walls, timings, strict=True)]
    return ControlCost(
        profile=profile,
        workers=len(ctx.workers),
        slots=slots,
        serial_ms=[(t.decide_s - t.deployers_s - t.planner_s) * 1000 for t in timings],
        # the planner's CPU is not timed apart: slot 0's CPU includes it
        serial_cpu_ms=[(t.decide_cpu_s - t.deployers_cpu_s) * 1000 for t in timings[1:] or timings],
        deployer_p95_ms=p95 * 1000,
        deployer_cpu_p95_ms=cpu_p95 * 1000,
        planner_ms=max(t.planner_s for t in timings) * 1000,
        router_ms=statistics.mean(t.router_s for t in timings) * 1000,
        emulator_ms=statistics.mean(emulator) * 1000,
    )


def _p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)] if ordered else 0.0


def peak_rss_mib() -> float:
    """This process's peak resident memory so far (MiB; Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def growth_exponent(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Least-squares slope of log y on log x; None with fewer than two positive points."""
    pts = [(math.log(x), math.log(y)) for x, y in zip(xs, ys, strict=True) if x > 0 and y > 0]
    if len(pts) < 2:
        return None
    mx = sum(p[0] for p in pts) / len(pts)
    my = sum(p[1] for p in pts) / len(pts)
    var = sum((p[0] - mx) ** 2 for p in pts)
    if var == 0:
        return None
    return sum((p[0] - mx) * (p[1] - my) for p in pts) / var


class GCTimer:
    """CPU seconds the cyclic garbage collector takes while the block runs."""

    def __init__(self) -> None:
        self.cpu_s = 0.0
        self._started = 0.0

    def _on_gc(self, phase: str, _info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.process_time()
        else:
            self.cpu_s += time.process_time() - self._started

    def __enter__(self) -> GCTimer:
        gc.callbacks.append(self._on_gc)
        return self

    def __exit__(self, *_exc: object) -> None:
        gc.callbacks.remove(self._on_gc)


def measure_loop(
    path: Path, profile: str = "ma", slots: int = 200, seed: int = 1
) -> dict[str, float]:
    """The whole control loop on `path` for `slots` slots (no settling, no store), this process.

    What `lmedge simulate` does, in three timed parts: loading the scenario,
    the planner's random baseline (one epoch of `rr`, `runner.baseline_metrics`)
    and the loop itself, for which the CPU time, the share of it in Python's
    cyclic GC (gc.callbacks) and the records are counted too. Peak RSS is the
    process's, so run it in a fresh process for a clean number.
    """

    from lmedge.bench.runner import EMULATOR_STORE_EVERY, baseline_metrics

    t0 = time.perf_counter()
    scenario = load_scenario(path)
    loaded = time.perf_counter()
    baseline = baseline_metrics(scenario, seed)
    based = time.perf_counter()
    backend = emulated_backend(scenario, seed)
    ctx = backend.context()
    loop = ControlLoop(
        backend,
        build_plugins(PolicyChoice(profile), ctx, seed),
        run_id="scale-loop",
        seed=seed,
        baseline=baseline,
        store_every=EMULATOR_STORE_EVERY,
        keep_history=False,
    )
    with quiet_gc(), GCTimer() as gc_time:
        try:
            wall0, cpu0 = time.perf_counter(), time.process_time()
            for t in range(slots):
                loop.step(t)
            cpu = time.process_time() - cpu0
            wall = time.perf_counter() - wall0
        finally:
            loop.close()
    records = sum(e.requests for e in loop.result.epochs) if loop.result.epochs else 0
    return {
        "workers": len(ctx.workers),
        "slots": slots,
        "load_s": loaded - t0,
        "baseline_s": based - loaded,
        "loop_wall_s": wall,
        "loop_cpu_s": cpu,
        "gc_s": gc_time.cpu_s,
        "gc_share": gc_time.cpu_s / cpu if cpu else 0.0,
        "requests_in_epochs": records,
        "peak_rss_mib": peak_rss_mib(),
    }


def measure_control_plane(path: Path, profile: str = "ma", slots: int = 3) -> dict[str, Any]:
    """One profile's control plane on `path`, with the agents' prompt sizes and the RSS.

    Loads the scenario, estimates each agent's prompt tokens
    (`lmedge.agents.hierarchy.prompt_tokens`, the form each agent would
    choose) and runs `control_plane_cost`. `peak_rss_mib` is the process's
    (scenario, emulator and controller together, an upper bound on the
    controller's alone): run it in a fresh process for a clean number.
    """
    from lmedge.agents.hierarchy import prompt_tokens

    t0 = time.perf_counter()
    scenario = load_scenario(path)
    load_s = time.perf_counter() - t0
    ctx = emulated_backend(scenario, 1).context()
    t0 = time.perf_counter()
    tokens = {a: prompt_tokens(a, ctx) for a in ("planner", "scheduler", "deployer")}
    tokens_s = time.perf_counter() - t0
    del ctx
    cost = control_plane_cost(scenario, profile, slots)
    return {
        **cost.row(),
        "load_s": round(load_s, 1),
        "prompt_tokens": tokens,
        "prompt_tokens_s": round(tokens_s, 1),
        "peak_rss_mib": round(peak_rss_mib(), 1),
        # the machine's 1-minute load average at the end: CPU times grow under load too
        "load_average": round(os.getloadavg()[0], 2),
    }
