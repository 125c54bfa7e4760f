"""`lmedge simulate`, `lmedge bench`, `lmedge demo`: the control loop on the emulator.

- `simulate` runs one policy and prints a table (or, with `--json`, one
  deterministic JSON object: same scenario, policy and seed -> the same bytes);
- `bench` runs several policies (and scenarios, and seeds) on identical traces
  and writes a report folder with tables and figures;
- `demo` runs the bundled `testbed` with the best available policy next to
  the RR and RF baselines, stores the decisions and writes a report.

Every user mistake (a bad manifest, an unknown policy, a bad flag value) is a
`UserError`: one line on stderr and exit code 2. Each command registers the
plugins first (`lmedge.processes.plugins.register_plugins`), and hands the
same function to the worker processes of a pool or of Ray.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from lmedge.agents.settings import agentic_params
from lmedge.api.params_file import ParamsFile, merge_params, read_params
from lmedge.api.runconfig import DEFAULT_PROFILE
from lmedge.bench.executors import executor_for
from lmedge.bench.runner import (
    RunData,
    RunExecutor,
    RunOutcome,
    RunSpec,
    Warmup,
    resolve_scenario,
    run,
)
from lmedge.bench.summary import dumps
from lmedge.cli.console import (
    AddressOpt,
    ExecutorOpt,
    ScenarioOpt,
    WorkersOpt,
    err,
    parse_seeds,
    progress_bar,
)
from lmedge.controller.assembly import PolicyChoice
from lmedge.controller.catalog import PROFILES, profile
from lmedge.errors import ConfigError
from lmedge.processes.plugins import register_plugins
from lmedge.store import Store, StoreOptions, open_store, parse_store_location

out = Console()

#: Demo preference: the multi-agent profile, then the best deterministic ones
#: by the paper's objective (LL, AL, RL use Lyapunov deployment), then RF.
DEMO_PREFERENCE = ("ma", "ll", "al", "rl", "rf", "rr")
BENCH_OUT = Path("reports/bench")
DEMO_OUT = Path("reports/demo")


def _check_slots(slots: int | None) -> None:
    if slots is not None and slots < 1:
        raise ConfigError(f"--slots must be at least 1, got {slots}")


def _report_folder(path: Path) -> Path:
    """Create the report folder before any run, so a bad --out costs no run time."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"--out {path}: cannot create the report folder: {exc.strerror}") from exc
    return path


def _plugin_params(**given: list[str] | None) -> dict[str, dict[str, str]]:
    """{tier: {key: value}} from repeated `--<tier>-param KEY=VALUE` options.

    Values stay strings; each plugin parses and validates its own (a bad key
    or value fails when the plugin is built, before the run starts).
    """
    out: dict[str, dict[str, str]] = {}
    for tier, items in given.items():
        for item in items or []:
            key, sep, value = item.partition("=")
            if not sep or not key.strip():
                raise ConfigError(f"--{tier}-param takes KEY=VALUE, got {item!r}")
            out.setdefault(tier, {})[key.strip()] = value.strip()
    return out


ParamsOpt = Annotated[
    Path | None,
    typer.Option(
        "--params",
        help="Plugin parameters file (YAML, e.g. from `lmedge calibrate --params`); "
        "--<tier>-param flags win over it.",
    ),
]


def _tiers(choice: PolicyChoice) -> dict[str, str]:
    p = choice.resolve()
    return {"planner": p.planner, "router": p.router, "deployer": p.deployer}


def _with_params(choices: Sequence[PolicyChoice], file: ParamsFile) -> list[PolicyChoice]:
    """Each profile with the file's parameters of every tier whose plugin they are for.

    A bench compares profiles with different plugins; parameters made for one
    (calibrate's are for the lyapunov deployer) go only to the profiles using it.
    """
    out = []
    for c in choices:
        mine = file.for_tiers(_tiers(c))
        out.append(dataclasses.replace(c, params=merge_params(c.params, mine)) if mine else c)
    return out


def _choice(
    policy: str, planner: str | None, router: str | None, deployer: str | None
) -> PolicyChoice:
    choice = PolicyChoice(policy, planner, router, deployer)
    choice.resolve()  # unknown names fail here, before any work
    return choice


@contextmanager
def _progress(enabled: bool) -> Iterator[Any]:
    """A rich progress bar on stderr; yields `update(done, total, label)` (a no-op if off)."""
    if not enabled:
        yield lambda done, total, label: None
        return
    bar = progress_bar(terminal_only=False)
    tasks: dict[str, Any] = {}

    def update(done: int, total: int, label: str) -> None:
        if label not in tasks:
            tasks[label] = bar.add_task(label, total=total)
        bar.update(tasks[label], completed=done, total=total)

    with bar:
        yield update


@contextmanager
def _maybe_store(uri: str | None, enabled: bool) -> Iterator[Store | None]:
    if not enabled:
        yield None
        return
    # The embedded store commits one SQLite transaction per batch, and a batch of
    # records lands all over a large collection: 5,000 a batch write each page
    # of it a tenth as often as the default 500 (a MongoDB server's batches).
    embedded = parse_store_location(uri).kind == "embedded"
    store = open_store(uri, options=StoreOptions(batch_size=5_000) if embedded else None)
    try:
        store.check_spill_dir()  # records of an outage must have somewhere to go
        yield store
    finally:
        store.close()


def _label(spec: RunSpec) -> str:
    return f"{spec.scenario.name} {spec.choice.resolve().name} s{spec.seed}"


def _run_with_progress(
    spec: RunSpec,
    store: Store | None,
    update: Any,
    label: str,
    on_start: Callable[[Warmup], None] | None = None,
) -> RunOutcome:
    return run(spec, store=store, on_slot=lambda d, t: update(d, t, label), on_start=on_start)


def _say_warmup(w: Warmup) -> None:
    """What a run costs beyond its measured slots, before it starts (on stderr)."""
    baseline = (
        f"a random-baseline epoch of {w.baseline} slots"
        if w.baseline
        else "no random baseline (the planner reads none)"
    )
    err.print(
        f"warm-up: {w.settle} settling slots, {baseline}; --no-settle / --warmup K to change",
        highlight=False,
        soft_wrap=True,
    )


def _loops(paths: Sequence[Path]) -> dict[str, tuple[float, float]]:
    """{scenario name: (slot_s, tau_s)} for the report's axes and τ lines."""
    from lmedge.sim import load_scenario

    out = {}
    for path in paths:
        sc = load_scenario(path)
        out[sc.name] = (sc.spec.loop.slot_s, sc.spec.loop.tau_s)
    return out


def _bench_tables(outcomes: Sequence[RunOutcome | RunData]) -> list[Table]:
    """One table per scenario: each policy's headline, means over seeds (fits 80 columns)."""
    from lmedge.bench.report import aggregate

    def f(x: Any, d: int = 3) -> str:
        return "–" if x is None else f"{x:.{d}f}"

    tables = []
    for scenario, by_policy in aggregate([o.summary for o in outcomes]).items():
        seeds = sorted({seed for row in by_policy.values() for seed in row["seeds"]})
        table = Table(title=escape(f"{scenario} · seeds {','.join(map(str, seeds))}"))
        # success beside J, and the LM-mean latency with failures at τ beside the
        # served-only one: a profile that refuses work cannot look faster
        cols = ("policy", "J ↓", "success", "Jain ↑", "rejected", "LM-mean", "at τ", "mean (s)")
        for col in cols:
            table.add_column(col, justify="left" if col == "policy" else "right")
        for policy, r in by_policy.items():
            table.add_row(
                escape(policy),
                f(r["objective"]),
                f(r["success_ratio"]),
                f(r["jain"]),
                f(r["rejected_ratio"]),
                f(r["lm_mean_latency_s"], 1),
                f(r.get("lm_mean_penalized_latency_s"), 1),
                f(r["mean_latency_s"], 1),
            )
        tables.append(table)
    return tables


def _table(outcome: RunOutcome) -> Table:
    s, t = outcome.summary, outcome.timing

    def f(x: Any, d: int = 3) -> str:
        return "–" if x is None else f"{x:.{d}f}" if isinstance(x, float) else str(x)

    title = f"{s['scenario']} · {s['policy']} · seed {s['seed']} · {s['slots']} slots"
    table = Table(title=escape(title))
    table.add_column("LM")
    table.add_column("requests", justify="right")
    table.add_column("success", justify="right")
    table.add_column("mean (s)", justify="right")
    table.add_column("at τ (s)", justify="right")  # failures counted at their deadline
    table.add_column("bound", justify="right")  # seconds
    for x in s["per_lm"]:
        table.add_row(
            x["lm"],
            str(x["arrivals"]),
            f(x["success_ratio"]),
            f(x["mean_latency_s"], 1),
            f(x["penalized_latency_s"], 1),
            f(x["lower_bound_s"], 1),
        )
    table.add_section()
    table.add_row(
        "all",
        str(s["requests"]),
        f(s["success_ratio"]),
        f(s["mean_latency_s"], 1),
    )
    # The paper's headline latency: the mean of the per-LM means above.
    table.add_row(
        "all (LM-mean)",
        "",
        "",
        f(s["lm_mean_latency_s"], 1),
        f(s["lm_mean_penalized_latency_s"], 1),
    )
    table.add_section()
    conf, rec = s["conflicts"], s["reconfiguration"]
    for label, value in (
        ("Jain", f(s["jain"])),
        ("F_norm", f(s["f_norm"])),
        ("T_norm", f(s["t_norm"])),
        ("objective J (lower is better)", f(s["objective"])),
        ("success ratio", f(s["success_ratio"])),  # beside J: refusing work lowers it
        ("rejected (admission control)", f(s["rejected_ratio"])),
        ("conflict ratio (cross-node)", f(conf["ratio"])),
        ("stranded requests", str(s.get("stranded", "-"))),
        ("activations / 100 decisions", f(rec["activations_per_100"], 1)),
        ("deactivations / 100 decisions", f(rec["deactivations_per_100"], 1)),
        ("decision time per slot (ms, mean)", f((t["decide_s_per_slot_mean"] or 0) * 1000, 2)),
        ("decision time per slot (ms, p95)", f((t["decide_s_per_slot_p95"] or 0) * 1000, 2)),
        ("wall time (s)", f(t["wall_s"], 2)),
    ):
        table.add_row(label, "", value, "")
    if "tokens" in s:  # token-engine LMs: TTFT / TPOT per LM, KV memory-time per node
        table.add_section()
        for x in s["tokens"]["per_lm"]:
            ttft = "/".join(f(x[f"ttft_s_{k}"], 2) for k in ("mean", "p50", "p99"))
            tpot = "/".join(f((x[f"tpot_s_{k}"] or 0) * 1000, 1) for k in ("mean", "p50", "p99"))
            table.add_row(f"{x['lm']} TTFT s / TPOT ms (mean/p50/p99)", "", ttft, tpot)
        kv = s["tokens"]["kv_gib_s"]  # per node in --json
        table.add_row("KV memory-time, all nodes (GiB·s)", "", f(float(sum(kv.values())), 1), "")
    return table


def register(app: typer.Typer) -> None:
    @app.command("simulate")
    def simulate(
        scenario: ScenarioOpt = "testbed",
        policy: str = typer.Option(
            DEFAULT_PROFILE,
            "--policy",
            "-p",
            help=f"Policy profile (default {DEFAULT_PROFILE}, the best measured), e.g. rr.",
        ),
        slots: int | None = typer.Option(None, help="Measured slots (default: the scenario's)."),
        seed: int = typer.Option(
            1, min=0, help="Seed of the trace, the emulator and the policies (>= 0)."
        ),
        store: str | None = typer.Option(
            None, help="Store URI or folder (default: $LMEDGE_STORE, else ./.lmedge/store)."
        ),
        no_store: bool = typer.Option(False, "--no-store", help="Do not write to any store."),
        planner: str | None = typer.Option(None, help="Override the profile's planner."),
        router: str | None = typer.Option(None, help="Override the profile's router."),
        deployer: str | None = typer.Option(None, help="Override the profile's deployer."),
        as_json: bool = typer.Option(False, "--json", help="Print one deterministic JSON object."),
        timings: bool = typer.Option(
            False, "--timings", help="With --json: add a `timing` key (wall clock, run id)."
        ),
        settle: bool = typer.Option(
            True,
            help="Keep running after the measured slots until their requests finish "
            "(the longest deadline's worth of slots, 31 for the testbed; each costs a "
            "slot's time). --no-settle: the last slots' requests may not have finished.",
        ),
        warmup: int | None = typer.Option(
            None,
            min=0,
            help="Slots of the random-baseline run before the measured ones, which an "
            "agentic planner with an LLM is shown (no other planner reads it, and none is "
            "run for them): default one epoch (the paper's); fewer measure it over a "
            "shorter window; 0: no baseline.",
        ),
        keep_history: bool = typer.Option(
            False,
            "--keep-history",
            help="Keep every request, decision and placement in memory (the summary is "
            "computed as the run goes and needs none; memory then grows with --slots).",
        ),
        llm_base_url: str | None = typer.Option(
            None, help="OpenAI-compatible endpoint for the agentic plugins (else: rule backends)."
        ),
        llm_model: str | None = typer.Option(None, help="Model name for the agentic plugins."),
        llm_api_key: str | None = typer.Option(
            None, help="API key for the agentic plugins (or LMEDGE_LLM_API_KEY)."
        ),
        planner_param: Annotated[
            list[str] | None,
            typer.Option(help="Planner plugin parameter KEY=VALUE; repeatable."),
        ] = None,
        router_param: Annotated[
            list[str] | None,
            typer.Option(
                help="Router plugin parameter KEY=VALUE; repeatable, e.g. admit_fraction=0.5."
            ),
        ] = None,
        deployer_param: Annotated[
            list[str] | None,
            typer.Option(help="Deployer plugin parameter KEY=VALUE; repeatable."),
        ] = None,
        params_file: ParamsOpt = None,
    ) -> None:
        """Run one policy on an emulated scenario and print its metrics."""
        register_plugins()
        _check_slots(slots)
        choice = _choice(policy, planner, router, deployer)
        tiers = choice.resolve()
        llm = agentic_params(
            {"planner": tiers.planner, "router": tiers.router, "deployer": tiers.deployer},
            llm_base_url,
            llm_model,
            llm_api_key,
        )
        given = _plugin_params(planner=planner_param, router=router_param, deployer=deployer_param)
        from_file: dict[str, dict[str, Any]] = {}
        if params_file:
            loaded = read_params(params_file)
            if wrong := loaded.mismatches(_tiers(choice)):
                raise ConfigError(f"--params {params_file}: {'; '.join(wrong)}")
            from_file = loaded.params
        params = merge_params(merge_params(llm, from_file), given)
        if params:
            choice = dataclasses.replace(choice, params=params)
        spec = RunSpec(
            resolve_scenario(scenario),
            choice,
            seed,
            slots,
            settle,
            warmup=warmup,
            keep_history=keep_history,
        )
        if store is not None:
            parse_store_location(store)
        with _maybe_store(store, not no_store) as st, _progress(err.is_terminal) as update:
            outcome = _run_with_progress(spec, st, update, choice.resolve().name, _say_warmup)
        # The store is closed here: drained, or what it could not send spilled.
        problem = _store_problem(st, outcome.run_id)
        if as_json:
            payload = dict(outcome.summary)
            if timings:
                payload["timing"] = {**outcome.timing, "run_id": outcome.run_id}
            sys.stdout.write(dumps(payload))
        else:
            out.print(_table(outcome))
            if st is not None and problem is None:
                out.print(f"run {outcome.run_id} stored in {st.where}", soft_wrap=True)
        _exit_on(problem)

    @app.command("bench")
    def bench(
        scenarios: Annotated[
            list[str] | None,
            typer.Option("--scenario", "-f", help="Scenario folder or example name; repeatable."),
        ] = None,
        policies: str | None = typer.Option(
            None,
            help="Comma-separated policy profiles (default rr,rf,ll; with --generated the "
            "paper's nine and cema, lyreo-greedy).",
        ),
        slots: int | None = typer.Option(None, help="Measured slots (default: the scenario's)."),
        seeds: str = typer.Option("1", help="Comma-separated seeds, e.g. 1,2,3."),
        out_dir: Annotated[Path, typer.Option("--out", "-o", help="Report folder.")] = BENCH_OUT,
        store: str | None = typer.Option(
            None, help="Also store every run in this store (runs then execute in this process)."
        ),
        params_file: ParamsOpt = None,
        workers: WorkersOpt = None,
        executor_name: ExecutorOpt = "local",
        address: AddressOpt = None,
        generated: int | None = typer.Option(
            None,
            min=1,
            help="Robustness bench: run on this many generated scenarios (`lmedge scenarios "
            "generate`, 4-12 workers, 3-8 LMs, 60 slots; written under OUT/scenarios) and "
            "rank each profile against the best of each scenario and seed.",
        ),
        first: int = typer.Option(
            1, "--from", min=0, help="With --generated: the first generator seed."
        ),
    ) -> None:
        """Run policies side by side on identical traces and write a report folder.

        Without --store the grid runs on a process pool (or on Ray with
        --executor ray); the results are those of a run in this process.
        """
        register_plugins()
        _check_slots(slots)
        if generated is not None:
            if scenarios or store is not None:
                raise ConfigError("--generated draws its own scenarios: drop -f/--store with it")
            _robustness(
                generated,
                first,
                policies,
                slots,
                seeds,
                out_dir,
                params_file,
                executor_for(workers, executor_name, address, setup=register_plugins),
            )
            return
        names = [p.strip() for p in (policies or "rr,rf,ll").split(",") if p.strip()]
        if not names:
            raise ConfigError("--policies names no policy")
        choices = [_choice(n, None, None, None) for n in names]
        if params_file:
            # The file's tiers apply to every profile whose plugin takes them:
            # a deployer's parameters reach only profiles with that deployer.
            choices = _with_params(choices, read_params(params_file))
        seed_list = parse_seeds(seeds)
        paths = [resolve_scenario(s) for s in scenarios or ["testbed"]]
        grid = [
            RunSpec(path, choice, seed, slots)
            for path in paths
            for seed in seed_list
            for choice in choices
        ]
        if store is not None and (executor_name != "local" or (workers or 1) > 1):
            raise ConfigError("--store runs in this process; drop --executor/--workers with it")
        executor = (
            None
            if store is not None
            else executor_for(workers, executor_name, address, setup=register_plugins)
        )
        _report_folder(out_dir)
        from lmedge.bench.report import write_report  # matplotlib: only when reporting

        if executor is not None:
            with _progress(err.is_terminal) as update:
                runs = executor.map(grid, lambda i, d: update(1, 1, _label(d.spec)))
            md = write_report(
                out_dir, [d.summary for d in runs], [d.timing for d in runs], loops=_loops(paths)
            )
            for table in _bench_tables(runs):
                out.print(table)
            out.print(f"report: {md}", soft_wrap=True)
            return
        outcomes: list[RunOutcome] = []
        with _maybe_store(store, store is not None) as st, _progress(err.is_terminal) as update:
            for spec in grid:
                outcomes.append(_run_with_progress(spec, st, update, _label(spec)))
        md = write_report(
            out_dir,
            [o.summary for o in outcomes],
            [{"run_id": o.run_id, **o.timing} for o in outcomes],
            loops=_loops(paths),
        )
        for table in _bench_tables(outcomes):
            out.print(table)
        out.print(f"report: {md}", soft_wrap=True)
        _exit_on(_store_problem(st, ", ".join(o.run_id for o in outcomes)))

    @app.command("demo")
    def demo(
        store: str | None = typer.Option(
            None, help="Store URI or folder (default: $LMEDGE_STORE, else ./.lmedge/store)."
        ),
        out_dir: Annotated[Path, typer.Option("--out", "-o", help="Report folder.")] = DEMO_OUT,
        slots: int = typer.Option(200, help="Measured slots."),
        seed: int = typer.Option(1, min=0, help="Seed (>= 0)."),
    ) -> None:
        """Run the bundled testbed with the best available policy and write a report."""
        register_plugins()
        _check_slots(slots)
        _report_folder(out_dir)
        best = next((p for p in DEMO_PREFERENCE if p in PROFILES), None)
        if best is None:
            raise ConfigError("no policy profile is registered")
        if best != DEMO_PREFERENCE[0]:
            err.print(
                f"profile {DEMO_PREFERENCE[0]!r} is not available; using {best!r} "
                f"({profile(best).summary})",
                highlight=False,
            )
        path = resolve_scenario("testbed")
        names = list(dict.fromkeys([best, "rr", "rf"]))
        outcomes: list[RunOutcome] = []
        with _maybe_store(store, True) as st, _progress(err.is_terminal) as update:
            assert st is not None
            where = st.where
            for name in names:
                spec = RunSpec(path, PolicyChoice(name), seed, slots)
                # Only the featured run is stored: the baselines are there to compare with.
                target = st if name == best else None
                outcomes.append(_run_with_progress(spec, target, update, name))
        from lmedge.bench.report import write_report  # matplotlib: only when reporting

        md = write_report(
            out_dir,
            [o.summary for o in outcomes],
            [{"run_id": o.run_id, **o.timing} for o in outcomes],
            loops=_loops([path]),
        )
        out.print(_table(outcomes[0]))
        location = parse_store_location(store)
        uri = store or str(location.path or location.uri)
        run_id = outcomes[0].run_id
        out.print(f"report: {md}", soft_wrap=True)
        out.print(f"decisions stored in {where} (run {run_id})", soft_wrap=True)
        out.print(
            f"inspect the planner's decisions: {_self_command()} decisions --store {uri} "
            "--agent planner",
            soft_wrap=True,
        )
        out.print(
            f"see it in a browser: {_self_command()} dashboard --store {uri} --reports "
            f"{out_dir.parent}  (then open http://localhost:8090/)",
            soft_wrap=True,
        )
        _exit_on(_store_problem(st, run_id))


def _robustness(
    count: int,
    first: int,
    policies: str | None,
    slots: int | None,
    seeds: str,
    out_dir: Path,
    params_file: Path | None,
    executor: RunExecutor,
) -> None:
    """`bench --generated`: generate, run every profile on each scenario and seed, score."""
    from lmedge.bench import paper, robustness
    from lmedge.bench.grid import heaviest_first
    from lmedge.cli.scenarios import default_pool
    from lmedge.sim.generator import load_pool

    given = policies or ",".join(paper.METHODS + paper.EXTRAS)
    names = [p.strip() for p in given.split(",") if p.strip()]
    if not names:
        raise ConfigError("--policies names no policy")
    choices = [_choice(n, None, None, None) for n in names]
    if params_file:
        choices = _with_params(choices, read_params(params_file))
    seed_list = parse_seeds(seeds)
    folder = _report_folder(out_dir)
    pool = load_pool(default_pool())
    # the timeline is drawn over the run: --slots sets the generator's run length
    bounds = robustness.BENCH_BOUNDS
    bounds = dataclasses.replace(bounds, slots=slots) if slots is not None else bounds
    paths = robustness.write_scenarios(first, count, folder / "scenarios", pool, bounds)
    grid = heaviest_first(
        [
            RunSpec(path, choice, seed, bounds.slots)
            for path in paths
            for seed in seed_list
            for choice in choices
        ]
    )
    with _progress(err.is_terminal) as update:
        done = [0]

        def step(_: int, d: RunData) -> None:
            done[0] += 1
            update(done[0], len(grid), f"{count} generated scenarios x {len(seed_list)} seeds")

        runs = executor.map(grid, step)
    payload = robustness.score([d.summary for d in runs])
    md = robustness.write(folder, payload)
    out.print(robustness.markdown(payload), markup=False, highlight=False, soft_wrap=True)
    out.print(f"report: {md}", soft_wrap=True)


def _store_problem(store: Store | None, run_id: str) -> str | None:
    """Why the run is not all in the (closed) store, or None when it is.

    A run's results are printed either way; this decides the exit status.
    """
    if store is None:
        return None
    stats = store.buffer_stats()
    if stats.lost:
        return (
            f"{stats.lost} documents of run {run_id} could not be stored in {store.where} "
            f"({stats.dropped} unspillable, {stats.refused} refused, {stats.conflicts} id "
            "conflicts); see the errors above"
        )
    if store.has_backlog():
        return (
            f"{store.where} did not answer before the run ended: documents of run {run_id} "
            f"wait in {store.spill_path.parent} and are stored by the next lmedge command "
            "that writes to this store"
        )
    return None


def _exit_on(problem: str | None) -> None:
    """Exit 1 with `problem` as one line on stderr, when there is one."""
    if problem is not None:
        err.print(f"[red]error:[/red] {escape(problem)}", highlight=False, soft_wrap=True)
        raise typer.Exit(1)


def _self_command() -> str:
    """How the user can run lmedge again: `lmedge` if it is on PATH, else its path
    (after `make demo` it lives in .venv/bin, which is usually not on PATH)."""
    import shutil
    from pathlib import Path

    exe = Path(sys.argv[0])
    if exe.name == "lmedge" and shutil.which("lmedge") != str(exe.resolve()) and exe.exists():
        try:
            return str(exe.resolve().relative_to(Path.cwd()))
        except ValueError:
            return str(exe.resolve())
    return "lmedge"
