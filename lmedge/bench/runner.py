"""Running one policy on one emulated scenario: the shared core of `simulate`, `bench`, `demo`.

A run is (scenario, policy choice, seed, slots). The emulator gives the same
trace for the same scenario and seed whatever the policy, so runs that differ
only in the policy are compared on identical arrivals. Each run:

1. loads the scenario (errors name the file and field);
2. for a planner that learns from it (anything but `random`/`static`/`none`),
   measures the random baseline for one epoch on the same trace, which the
   planner's observation carries (`PlanningObservation.baseline`);
3. runs the control loop for `slots` slots, then keeps it running for
   `settle` slots (default: the longest deadline) so that every measured
   request reaches an outcome; only requests of the measured slots count.

Scenarios are found by path, or by the name of a bundled example (`testbed`):
see `resolve_scenario`.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

from lmedge.api import ClusterBackend, ClusterContext, EpochMetrics
from lmedge.backends.emulated.backend import EmulatedBackend
from lmedge.bench.summary import summarize, timing_summary
from lmedge.controller.assembly import PolicyChoice, build_plugins
from lmedge.controller.loop import ControlLoop, RunResult
from lmedge.errors import ConfigError, StoreUnavailable
from lmedge.metrics import metric_lms, window_metrics
from lmedge.sim import Scenario, load_scenario
from lmedge.store import RunInfo, Store

#: Planners that ignore the random-policy baseline, so it is not measured for them.
BASELINE_FREE_PLANNERS = frozenset({"random", "static", "none"})
#: Environment variable naming a folder of example scenarios.
EXAMPLES_ENV = "LMEDGE_EXAMPLES"
#: Slots per store batch in the emulator: virtual slots pass in milliseconds,
#: so batching many keeps the embedded store's transactions few.
EMULATOR_STORE_EVERY = 25


def examples_dirs() -> list[Path]:
    """Where bundled example scenarios are looked up, in order."""
    dirs: list[Path] = []
    if env := os.environ.get(EXAMPLES_ENV):
        dirs.append(Path(env))
    package = Path(__file__).resolve().parents[1]
    dirs.append(package / "examples")  # shipped as package data, when it is
    dirs.append(package.parent / "examples")  # a source checkout (editable install)
    return dirs


def resolve_scenario(name_or_path: str | Path) -> Path:
    """A scenario folder: the path itself if it exists, else a bundled example by name."""
    path = Path(name_or_path)
    if path.exists():
        return path
    if len(path.parts) == 1:
        for d in examples_dirs():
            if (d / path.name).is_dir():
                return d / path.name
    looked = ", ".join(str(d) for d in examples_dirs())
    raise ConfigError(
        f"scenario {str(name_or_path)!r} not found: not a path, and no example of that "
        f"name in {looked}"
    )


@dataclass(frozen=True)
class RunSpec:
    """One run to perform."""

    scenario: Path
    choice: PolicyChoice
    seed: int = 1
    slots: int | None = None
    settle: bool = True
    overrides: dict[str, Any] | None = None


@dataclass
class RunOutcome:
    """A finished run with its summary (deterministic) and timing (not)."""

    spec: RunSpec
    scenario: Scenario
    run_id: str
    result: RunResult
    summary: dict[str, Any]
    timing: dict[str, Any]


def load(spec: RunSpec) -> Scenario:
    return load_scenario(spec.scenario, **(spec.overrides or {}))


def settle_slots(ctx: ClusterContext) -> int:
    """Slots until a request of the last measured slot has surely finished."""
    longest = max((ctx.deadline_s(lm) for lm in ctx.lm_names), default=ctx.tau_s)
    return math.ceil(longest / ctx.slot_s) + 1


def emulated_backend(scenario: Scenario, seed: int) -> ClusterBackend:
    """The emulator behind the protocol the loop drives."""
    # `EmulatedBackend.clock` is annotated as its concrete `SimClock`, which mypy
    # treats as a conflict with the protocol's mutable `clock: Clock` attribute.
    return cast(ClusterBackend, EmulatedBackend(scenario, seed))


def baseline_metrics(scenario: Scenario, seed: int) -> EpochMetrics:
    """The random baseline (random planner, router and deployer) over one epoch."""
    backend = emulated_backend(scenario, seed)
    ctx = backend.context()
    choice = PolicyChoice("rr", planner="random")
    loop = ControlLoop(backend, build_plugins(choice, ctx, seed), run_id="baseline", seed=seed)
    result = loop.run(ctx.epoch_slots)
    return window_metrics(
        result.records,
        metric_lms(ctx, result.records),
        tau_s=ctx.tau_s,
        lam=ctx.lam,
        deadlines={lm: ctx.deadline_s(lm) for lm in ctx.lm_names},
    )


def new_run_id(scenario: str, policy: str, seed: int) -> str:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%f")
    safe = "".join(c if c.isalnum() or c in "-_" else "-" for c in policy)
    return f"{scenario}-{safe}-s{seed}-{stamp}"


def run(
    spec: RunSpec,
    *,
    store: Store | None = None,
    on_slot: Callable[[int, int], None] | None = None,
    scenario: Scenario | None = None,
) -> RunOutcome:
    """Perform `spec`; `on_slot(done, total)` reports progress."""
    sc = scenario or load(spec)
    slots = spec.slots if spec.slots is not None else sc.spec.loop.slots
    if slots < 1:
        raise ConfigError(f"--slots must be at least 1, got {slots}")
    backend = emulated_backend(sc, spec.seed)
    ctx = backend.context()
    plugins = build_plugins(spec.choice, ctx, spec.seed)
    profile = spec.choice.resolve()
    baseline = (
        baseline_metrics(sc, spec.seed) if profile.planner not in BASELINE_FREE_PLANNERS else None
    )
    run_id = new_run_id(sc.name, plugins.name, spec.seed)
    # The loop ranks the cases itself (lowest objective first); fetch enough to rank.
    memory: list[Any] = []
    if store is not None and baseline is not None:
        try:
            memory = store.memory_cases(limit=200)
        except StoreUnavailable:  # memory is advice: the run goes on without it
            memory = []
    if store is not None:
        store.record_run(RunInfo(id=run_id, scenario=sc.name, policy=plugins.name, seed=spec.seed))
    loop = ControlLoop(
        backend,
        plugins,
        run_id=run_id,
        seed=spec.seed,
        store=store,
        baseline=baseline,
        memory=memory,
        store_every=EMULATOR_STORE_EVERY,
    )
    settle = settle_slots(ctx) if spec.settle else 0
    total = slots + settle
    started = time.perf_counter()
    result = loop.run(
        slots,
        (lambda t: on_slot(t + 1, total)) if on_slot else None,
        settle_slots=settle,
    )
    wall = time.perf_counter() - started
    if store is not None:
        # Waits out a short outage (StoreOptions.drain_s) instead of failing the
        # run; what is still unsent then waits in the store's buffer and spill
        # file, and the caller decides what that means (the CLI's exit status).
        store.drain()
    components = {
        "planner": profile.planner,
        "router": profile.router,
        "deployer": profile.deployer,
    }
    summary = summarize(result, scenario=sc.name, seed=spec.seed, components=components)
    return RunOutcome(spec, sc, run_id, result, summary, timing_summary(result, wall))
