"""Running one policy on one emulated scenario: the shared core of `simulate`, `bench`, `demo`.

A run is (scenario, policy choice, seed, slots). The emulator gives the same
trace for the same scenario and seed whatever the policy, so runs that differ
only in the policy are compared on identical arrivals. Each run:

1. loads the scenario (errors name the file and field);
2. for a planner that reads it (`Capabilities.reads_baseline`: the agentic
   planner with an LLM), measures the random baseline on the same trace,
   which the planner's observation carries (`PlanningObservation.baseline`):
   one epoch by default, `RunSpec.warmup` slots when given (0: none, the
   planner has no reference);
3. runs the control loop for `slots` slots, then keeps it running for
   `settle` slots (default: the longest deadline) so that every measured
   request reaches an outcome; only requests of the measured slots count.

Steps 2 and 3 cost loop slots beyond the measured ones; `warmup_slots` says
how many, so that a command can print them before it starts.

Scenarios are found by path, or by the name of a bundled example (`testbed`):
see `resolve_scenario`.

Many runs (a grid of scenarios, policies and seeds) go through a
`RunExecutor`: `SequentialExecutor` in this process, or
`ProcessPoolRunExecutor` over a pool of worker processes. Each run is
independent and fully determined by its `RunSpec`, so every executor returns
the same `RunData` for the same specs, in spec order; `RayRunExecutor`
(lmedge.bench.distributed) runs them on a Ray cluster the same way, and
`lmedge.bench.executors.executor_for` picks one from the CLI's flags. A run
builds its policy from the plugin catalog, which the process's root fills
(`lmedge.processes.plugins.register_plugins`); a pool's worker processes are
filled by the `setup` the executor is given.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol, cast

from lmedge.api import ClusterBackend, ClusterContext, EpochMetrics, capabilities_of
from lmedge.api.totals import LoadBalanceStats, RunTotals
from lmedge.backends.emulated.backend import EmulatedBackend
from lmedge.bench.summary import (
    DIGITS,
    WINDOW_SLOTS,
    balance_stats,
    balance_summary,
    rounded,
    routing_summary,
    summarize,
    timing_summary,
    window_totals,
)
from lmedge.bench.tally import RunTally
from lmedge.controller.assembly import PolicyChoice, build_plugins
from lmedge.controller.loop import ControlLoop, RunResult
from lmedge.errors import ConfigError, StoreUnavailable
from lmedge.metrics import lms_named
from lmedge.sim import Scenario, load_scenario
from lmedge.store import RunInfo, Store

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
    try:
        if path.exists():
            return path
        if len(path.parts) == 1:
            for d in examples_dirs():
                if (d / path.name).is_dir():
                    return d / path.name
    except OSError as exc:  # e.g. a name longer than the file system allows
        raise ConfigError(f"scenario {str(name_or_path)[:80]!r}: {exc.strerror}") from exc
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
    #: Slots of the random baseline (at most an epoch); None: one epoch, 0: none.
    warmup: int | None = None
    overrides: dict[str, Any] | None = None
    #: Keep every record, decision and placement in `RunOutcome.result` (for
    #: figures and inspection); the summary never needs them (`RunTally`).
    keep_history: bool = False


@dataclass
class RunOutcome:
    """A finished run with its summary (deterministic) and timing (not)."""

    spec: RunSpec
    scenario: Scenario
    run_id: str
    result: RunResult
    summary: dict[str, Any]
    timing: dict[str, Any]
    #: The measured requests as columns, when `run` was asked for them.
    requests: RequestTable | None = None


def load(spec: RunSpec) -> Scenario:
    return load_scenario(spec.scenario, **(spec.overrides or {}))


def settle_slots(ctx: ClusterContext) -> int:
    """Slots until a request of the last measured slot has surely finished."""
    longest = max((ctx.deadline_s(lm) for lm in ctx.lm_names), default=ctx.loop.tau_s)
    return math.ceil(longest / ctx.loop.slot_s) + 1


def emulated_backend(scenario: Scenario, seed: int) -> ClusterBackend:
    """The emulator behind the protocol the loop drives."""
    # `EmulatedBackend.clock` is annotated as its concrete `SimClock`, which mypy
    # treats as a conflict with the protocol's mutable `clock: Clock` attribute.
    return cast(ClusterBackend, EmulatedBackend(scenario, seed))


@dataclass(frozen=True)
class Warmup:
    """The loop slots a run spends beyond its measured ones."""

    #: Slots after the measured ones, so that their requests reach an outcome.
    settle: int
    #: Slots of the random-baseline run before it (0: no baseline).
    baseline: int


def warmup_slots(spec: RunSpec, ctx: ClusterContext, planner: object) -> Warmup:
    """What `spec` costs beyond its measured slots on the scenario of `ctx`.

    The baseline is measured only for a `planner` that reads it
    (`Capabilities.reads_baseline`). Bad `spec.warmup` (negative, or longer
    than an epoch) is a `ConfigError`.
    """
    epoch = ctx.loop.epoch_slots
    if spec.warmup is not None and not 0 <= spec.warmup <= epoch:
        raise ConfigError(
            f"--warmup must be between 0 and the scenario's epoch ({epoch} slots), "
            f"got {spec.warmup}"
        )
    baseline = 0
    if capabilities_of(planner).reads_baseline:
        baseline = epoch if spec.warmup is None else spec.warmup
    return Warmup(settle=settle_slots(ctx) if spec.settle else 0, baseline=baseline)


def baseline_metrics(scenario: Scenario, seed: int, slots: int | None = None) -> EpochMetrics:
    """The random baseline (random planner, router and deployer) over `slots` slots.

    One epoch by default; fewer slots measure it over a shorter window of the
    same trace (what finished by then), for a cheaper start.
    """
    backend = emulated_backend(scenario, seed)
    ctx = backend.context()
    epoch = ctx.loop.epoch_slots
    slots = epoch if slots is None else slots
    choice = PolicyChoice("rr", planner="random")
    # The loop's own metrics of its first epoch: the same records, and no
    # per-request history (an epoch of records is over a GiB at 1,000 workers).
    loop = ControlLoop(
        backend,
        build_plugins(choice, ctx, seed),
        run_id="baseline",
        seed=seed,
        keep_history=False,
    )
    result = loop.run(slots)
    metrics = result.epochs[0] if slots == epoch else loop.epoch_metrics()
    # a reference objective: the random routes' off-role share is not reported
    return metrics.model_copy(update={"off_role_ratio": 0.0})


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
    request_columns: bool = False,
    on_start: Callable[[Warmup], None] | None = None,
) -> RunOutcome:
    """Perform `spec`; `on_slot(done, total)` reports progress.

    `on_start` hears the run's extra slots (`Warmup`) before any slot runs.

    The summary is computed as the run goes (`RunTally`): without
    `spec.keep_history` nothing per request is kept, and memory does not grow
    with the slots. `request_columns` also collects the measured requests as
    a `RequestTable` (`RunOutcome.requests`), about 30 bytes each.
    """
    sc = scenario or load(spec)
    slots = spec.slots if spec.slots is not None else sc.spec.loop.slots
    if slots < 1:
        raise ConfigError(f"--slots must be at least 1, got {slots}")
    backend = emulated_backend(sc, spec.seed)
    ctx = backend.context()
    plugins = build_plugins(spec.choice, ctx, spec.seed)
    profile = spec.choice.resolve()
    warmup = warmup_slots(spec, ctx, plugins.planner)
    if on_start is not None:
        on_start(warmup)
    baseline = baseline_metrics(sc, spec.seed, warmup.baseline) if warmup.baseline else None
    run_id = new_run_id(sc.name, plugins.name, spec.seed)
    # The loop ranks the cases itself (lowest objective first); fetch enough to rank.
    # Past cases, like the baseline, are read only by a planner's LLM prompt.
    memory: list[Any] = []
    if store is not None and capabilities_of(plugins.planner).reads_baseline:
        try:
            memory = store.memory_cases(limit=200)
        except StoreUnavailable:  # memory is advice: the run goes on without it
            memory = []
    if store is not None:
        store.record_run(RunInfo(id=run_id, scenario=sc.name, policy=plugins.name, seed=spec.seed))
    tally = RunTally(ctx, slots, WINDOW_SLOTS, columns=request_columns)
    loop = ControlLoop(
        backend,
        plugins,
        run_id=run_id,
        seed=spec.seed,
        store=store,
        baseline=baseline,
        memory=memory,
        store_every=EMULATOR_STORE_EVERY,
        keep_history=spec.keep_history,
        recorder=tally,
    )
    settle = warmup.settle
    total = slots + settle
    started = time.perf_counter()
    result = loop.run(
        slots,
        (lambda t: on_slot(t + 1, total)) if on_slot else None,
        settle_slots=settle,
    )
    wall = time.perf_counter() - started
    components = {
        "planner": profile.planner,
        "router": profile.router,
        "deployer": profile.deployer,
    }
    kv = backend.emulator.kv_gib_s() if isinstance(backend, EmulatedBackend) else None
    summary = summarize(
        result, tally, scenario=sc.name, seed=spec.seed, components=components, kv_gib_s=kv
    )
    if isinstance(backend, EmulatedBackend) and backend.emulator.kv_samples:
        summary["balance"] = balance_summary(tally, backend.emulator.kv_samples)
    windows = getattr(plugins.router, "window_totals", None)
    summary["routing"] = routing_summary(tally.energy_j, windows)
    timing = timing_summary(tally, wall)
    if isinstance(backend, EmulatedBackend) and backend.emulator.window_stats["windows"]:
        stats = backend.emulator.window_stats
        timing["route_window_s_mean"] = round(stats["decision_s"] / stats["windows"], DIGITS)
        timing["route_windows"], timing["route_window_fallbacks"] = (
            stats["windows"],
            stats["fallbacks"],
        )
    if store is not None:
        store.record_totals(run_totals(run_id, tally, backend, plugins.router))
        # Waits out a short outage (StoreOptions.drain_s) instead of failing the
        # run; what is still unsent then waits in the store's buffer and spill
        # file, and the caller decides what that means (the CLI's exit status).
        store.drain()
    requests = request_table(tally) if request_columns else None
    return RunOutcome(spec, sc, run_id, result, summary, timing, requests)


def run_totals(run_id: str, tally: RunTally, backend: ClusterBackend, router: object) -> RunTotals:
    """What the run stores once, at its end (`lmedge.api.totals`): its balance metrics
    and its routing windows, summed; bounded whatever the run's length."""
    balance = windows = None
    if isinstance(backend, EmulatedBackend):
        emulator = backend.emulator
        if emulator.kv_samples:
            balance = LoadBalanceStats.model_validate(
                rounded(balance_stats(tally, emulator.kv_samples).model_dump())
            )
        windows = window_totals(emulator.window_stats, getattr(router, "window_totals", None))
    return RunTotals(run=run_id, slots=tally.slots, balance=balance, windows=windows)


@dataclass(frozen=True)
class RequestTable:
    """The measured requests of a run as columns, for statistics over requests.

    A summary aggregates requests into windows; a bootstrap over the requests
    of a window, or arrivals per LM and slot, need the requests themselves.
    These columns are small enough to send back from a worker process (a few
    thousand rows per run), unlike the full records. `lm[k]` indexes `lms`;
    `latency_s` is rounded as in summaries, so tables compare exactly; `lam`
    is the run's objective weight λ.
    """

    lam: float
    lms: tuple[str, ...]
    slot: tuple[int, ...]
    lm: tuple[int, ...]
    prompts: tuple[int, ...]
    success: tuple[bool, ...]
    latency_s: tuple[float, ...]
    deadline_s: tuple[float, ...]

    def __len__(self) -> int:
        return len(self.slot)


def request_table(tally: RunTally) -> RequestTable:
    """The columns of the measured requests `tally` collected (`columns=True`), in record order."""
    cols = tally.columns
    if cols is None:
        raise ValueError("the run did not collect its requests (RunTally(columns=True))")
    ctx = tally.ctx
    names = list(cols.names)
    lms = list(lms_named(ctx, {names[k] for k in set(cols.lm)}))
    for k in cols.lm:  # an LM only in the records still counts (as in `window_metrics`)
        if names[k] not in lms:
            lms.append(names[k])
    index = {lm: k for k, lm in enumerate(lms)}
    code = [index.get(name, -1) for name in names]
    deadline = [ctx.deadline_s(name) if ctx.has_service(name) else ctx.loop.tau_s for name in names]
    return RequestTable(
        lam=ctx.loop.lam,
        lms=tuple(lms),
        slot=tuple(cols.slot),
        lm=tuple(code[k] for k in cols.lm),
        prompts=tuple(cols.prompts),
        success=tuple(bool(x) for x in cols.success),
        latency_s=tuple(cols.latency_s),
        deadline_s=tuple(deadline[k] for k in cols.serving),
    )


@dataclass(frozen=True)
class RunData:
    """What a grid run sends back: the deterministic summary and request columns,
    plus its timing (wall clock and the process's CPU seconds), which vary."""

    spec: RunSpec
    summary: dict[str, Any]
    requests: RequestTable
    timing: dict[str, Any]


def execute(spec: RunSpec) -> RunData:
    """Perform `spec` without a store; a module-level function, so a pool can pickle it."""
    cpu = time.process_time()
    outcome = run(spec, request_columns=True)
    cpu_s = round(time.process_time() - cpu, 3)
    timing = {"run_id": outcome.run_id, **outcome.timing, "cpu_s": cpu_s}
    assert outcome.requests is not None
    return RunData(spec, outcome.summary, outcome.requests, timing)


#: `on_done(index, data)`: run `index` of the specs has finished.
OnDone = Callable[[int, RunData], None]


class RunExecutor(Protocol):
    """Performs independent runs; results come back in the order of `specs`.

    Implementations differ only in where runs execute. Each run is a pure
    function of its spec (`execute`), so the results must not depend on the
    executor, the worker count or the completion order.
    """

    def map(self, specs: Sequence[RunSpec], on_done: OnDone | None = None) -> list[RunData]:
        """Perform every spec; `on_done` is called in the caller's process as runs finish."""
        ...


class SequentialExecutor:
    """Every run in this process, one after the other."""

    def map(self, specs: Sequence[RunSpec], on_done: OnDone | None = None) -> list[RunData]:
        out = []
        for i, spec in enumerate(specs):
            data = execute(spec)
            if on_done:
                on_done(i, data)
            out.append(data)
        return out


#: What a fresh worker process runs before its first run (e.g. `register_plugins`).
Setup = Callable[[], None]


class ProcessPoolRunExecutor:
    """Runs spread over `workers` processes (spawned, so no state leaks from the parent).

    Specs are submitted in the given order, so a caller that lists its longest
    runs first keeps the pool busy to the end. The first failing run cancels
    the rest and its exception is raised here. Each worker runs `setup` once
    before its first run: a spawned process starts with an empty plugin
    catalog, so the caller passes what fills it (a picklable function).
    """

    def __init__(self, workers: int, setup: Setup | None = None) -> None:
        if workers < 1:
            raise ConfigError(f"--workers must be at least 1, got {workers}")
        self.workers = workers
        self.setup = setup

    def map(self, specs: Sequence[RunSpec], on_done: OnDone | None = None) -> list[RunData]:
        results: dict[int, RunData] = {}
        if not specs:
            return []
        context = multiprocessing.get_context("spawn")
        workers = min(self.workers, len(specs))  # never more processes than runs
        with ProcessPoolExecutor(
            max_workers=workers, mp_context=context, initializer=self.setup
        ) as pool:
            pending: dict[Future[RunData], int] = {
                pool.submit(execute, spec): i for i, spec in enumerate(specs)
            }
            try:
                while pending:
                    done, _ = wait(pending, return_when=FIRST_COMPLETED)
                    for future in done:
                        i = pending.pop(future)
                        results[i] = future.result()
                        if on_done:
                            on_done(i, results[i])
            except BaseException:
                pool.shutdown(wait=False, cancel_futures=True)
                raise
        return [results[i] for i in range(len(specs))]
