"""`lmedge reproduce`: the paper's §VI results regenerated in one command.

Runs the grid of `lmedge.bench.grid` over a process pool (one worker per CPU
core by default) or, with `--executor ray --address ...`, on a Ray cluster
(same results either way), prints every side-by-side table and the paper's orderings
with holds / does not hold, and writes a report folder (`REPORT.md`,
`summary.json`, figures). A bad flag is a `ConfigError`: one line, exit 2.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from lmedge.cli.console import AddressOpt, ExecutorOpt, WorkersOpt, progress_bar
from lmedge.errors import ConfigError

#: Piped output gets wide lines: the side-by-side tables have up to a dozen columns.
out = Console() if sys.stdout.isatty() else Console(width=200)
REPRODUCE_OUT = Path("reports/reproduce")


def _ints(text: str, flag: str) -> tuple[int, ...]:
    try:
        values = tuple(int(s) for s in text.split(",") if s.strip())
    except ValueError:
        raise ConfigError(f"{flag} must be comma-separated integers, got {text!r}") from None
    negative = [v for v in values if v < 0]
    if negative:
        raise ConfigError(f"{flag} must be non-negative, got {negative[0]}")
    return values


def _names(text: str | None) -> tuple[str, ...] | None:
    return None if text is None else tuple(p.strip() for p in text.split(",") if p.strip())


def _verdict_style(holds: bool | None) -> str:
    return {True: "[green]holds[/green]", False: "[red]does not hold[/red]"}.get(
        holds,  # type: ignore[arg-type]
        "[yellow]not evaluated[/yellow]",
    )


def _print(repro: Any) -> None:
    for s in repro.sections:
        out.rule(escape(f"{s.title} — {s.ref}"))
        for t in s.tables:
            table = Table(title=escape(t.title), title_justify="left")
            for i, h in enumerate(t.header):
                table.add_column(escape(h), justify="left" if i == 0 else "right")
            for row in t.rows:
                table.add_row(*(escape("–" if c is None else str(c)) for c in row))
            out.print(table)
        for c in s.checks:
            out.print(f"  {_verdict_style(c.holds)}  {escape(c.claim)}: {escape(c.reason)}")
    for key, what in (("", "the paper's orderings hold"), ("targets", "lmedge's targets met")):
        checks = [c for s in repro.sections if (s.key == "targets") == bool(key) for c in s.checks]
        held = sum(1 for c in checks if c.holds)
        out.print(f"{what}: {held} of {len(checks)}")


def register(app: typer.Typer) -> None:
    @app.command("reproduce")
    def reproduce_cmd(
        out_dir: Annotated[Path, typer.Option("--out", "-o", help="Report folder.")] = (
            REPRODUCE_OUT
        ),
        seeds: str = typer.Option("1,2,3", help="Comma-separated seeds (non-negative)."),
        slots: int = typer.Option(
            200, help="Measured slots per testbed run and per bursty phase (paper: 200)."
        ),
        workers: WorkersOpt = None,
        executor_name: ExecutorOpt = "local",
        address: AddressOpt = None,
        quick: bool = typer.Option(
            False,
            "--quick",
            help="Seed 1, at most 30 slots, the paper's nine methods only: a fast smoke run.",
        ),
        policies: str | None = typer.Option(
            None,
            help="Comma-separated profiles to run (default: the paper's nine, cema, lyreo-greedy).",
        ),
        paper: str = typer.Option(
            "ma", help="Which paper: ma (default) or cema (CEMA-Router; --seeds, --slots, --quick)."
        ),
    ) -> None:
        """Regenerate the paper's Figs. 6-9 and Tables II-IV on the emulator, side by side."""
        from lmedge.bench import paper_report
        from lmedge.bench.executors import executor_for
        from lmedge.bench.grid import Options, plan
        from lmedge.bench.reproduce import reproduce
        from lmedge.processes.plugins import register_plugins

        register_plugins()
        if paper == "cema":
            _cema(out_dir, seeds, slots, workers, executor_name, address, quick)
            return
        if paper != "ma":
            raise ConfigError(f"--paper must be ma or cema, got {paper!r}")
        if slots < 1:
            raise ConfigError(f"--slots must be at least 1, got {slots}")
        if workers is not None and workers < 1:
            raise ConfigError(f"--workers must be at least 1, got {workers}")
        options = Options(_ints(seeds, "--seeds"), slots, quick, _names(policies))
        plan(options)  # every mistake in the flags or scenarios surfaces before any run
        try:  # and so does an --out the file system refuses, before minutes of runs
            out_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(
                f"--out {out_dir}: cannot create the report folder: {exc.strerror}"
            ) from exc
        executor = executor_for(workers, executor_name, address, setup=register_plugins)
        count = workers or os.cpu_count() or 1
        where = f"Ray at {address}" if executor_name == "ray" else f"{count} workers"
        bar = progress_bar()
        started = time.perf_counter()
        with bar:
            task = bar.add_task(f"reproduce ({where})", total=None)

            def done(n: int, total: int, data: Any) -> None:
                s = data.summary
                bar.update(
                    task,
                    completed=n,
                    total=total,
                    description=f"{s['scenario']} {s['policy']} s{s['seed']}",
                )

            repro = reproduce(options, executor, done)
        wall = time.perf_counter() - started
        _print(repro)
        parts = [f"--seeds {seeds}", f"--slots {slots}"]
        if quick:
            parts.append("--quick")
        if policies:
            parts.append(f"--policies {policies}")
        if executor_name == "ray":
            parts.append(f"--executor ray --address {address}")
        command = " ".join(["lmedge reproduce", *parts, f"-o {out_dir}"])
        note = paper_report.timing_note(repro.runs, count, wall)
        md = paper_report.write(out_dir, repro, command=command, cpu_note=note)
        out.print(note, soft_wrap=True)
        out.print(f"report: {md}", soft_wrap=True)


def _cema(
    out_dir: Path,
    seeds: str,
    slots: int,
    workers: int | None,
    executor_name: str,
    address: str | None,
    quick: bool,
) -> None:
    """`--paper cema`: `lmedge.bench.cema_repro` with the same flags and progress."""
    from lmedge.bench.cema_repro import CemaOptions, reproduce_cema, write
    from lmedge.bench.executors import executor_for
    from lmedge.bench.paper_report import timing_note
    from lmedge.processes.plugins import register_plugins

    if slots < 1:
        raise ConfigError(f"--slots must be at least 1, got {slots}")
    # the paper's 10 runs per method unless --seeds is given
    chosen = tuple(range(1, 11)) if seeds == "1,2,3" else _ints(seeds, "--seeds")
    options = CemaOptions(chosen, 60 if slots == 200 else slots, quick=quick)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(
            f"--out {out_dir}: cannot create the report folder: {exc.strerror}"
        ) from exc
    executor = executor_for(workers, executor_name, address, setup=register_plugins)
    count = workers or os.cpu_count() or 1
    bar = progress_bar()
    started = time.perf_counter()
    with bar:
        task = bar.add_task("reproduce --paper cema", total=None)

        def done(n: int, total: int, what: str) -> None:
            bar.update(task, completed=n, total=total, description=what)

        repro = reproduce_cema(options, executor, done)
    wall = time.perf_counter() - started
    _print(repro)
    o = repro.options
    command = (
        f"lmedge reproduce --paper cema --seeds {','.join(map(str, o.seeds))} "
        f"--slots {o.slots}{' --quick' if quick else ''} -o {out_dir}"
    )
    note = timing_note(repro.runs, count, wall)
    md = write(out_dir, repro, command=command, note=note)
    out.print(note, soft_wrap=True)
    out.print(f"report: {md}", soft_wrap=True)
