"""`lmedge reproduce`: a paper's results regenerated in one command.

`--paper ma` (the default) is the MA paper's §VI, `--paper lyreo` LYREO's §V,
`--paper cema` CEMA-Router's §V (`PAPERS` names the module of each;
`lmedge.bench.papers` is what it offers).
Runs the paper's grid over a process pool (one worker per CPU
core by default) or, with `--executor ray --address ...`, on a Ray cluster
(same results either way), prints every side-by-side table and the paper's orderings
with holds / does not hold, and writes a report folder (`REPORT.md`,
`summary.json`, figures). A bad flag is a `ConfigError`: one line, exit 2.
"""

from __future__ import annotations

import importlib
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, cast

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from lmedge.cli.console import AddressOpt, ExecutorOpt, WorkersOpt, progress_bar
from lmedge.errors import ConfigError

if TYPE_CHECKING:
    from lmedge.bench.papers import Reproducer

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
    targets = any(s.key == "targets" for s in repro.sections)
    for key, what in (("", "the paper's orderings hold"), ("targets", "lmedge's targets met")):
        if key and not targets:
            continue
        checks = [c for s in repro.sections if (s.key == "targets") == bool(key) for c in s.checks]
        held = sum(1 for c in checks if c.holds)
        out.print(f"{what}: {held} of {len(checks)}")


#: `--paper` values: the module whose `REPRODUCER` (`lmedge.bench.papers.Reproducer`)
#: regenerates that paper's results. A paper plugs in with one line here.
PAPERS: dict[str, str] = {
    "ma": "lmedge.bench.reproduce",
    "lyreo": "lmedge.bench.lyreo_repro",
    "cema": "lmedge.bench.cema_repro",
}
DEFAULT_PAPER = "ma"


def reproducer(name: str) -> Reproducer:
    """The `REPRODUCER` of paper `name` (a `ConfigError` names the known ones)."""
    if name not in PAPERS:
        raise ConfigError(f"--paper must be one of {', '.join(PAPERS)}, got {name!r}")
    return cast("Reproducer", importlib.import_module(PAPERS[name]).REPRODUCER)


def register(app: typer.Typer) -> None:
    @app.command("reproduce")
    def reproduce_cmd(
        out_dir: Annotated[Path, typer.Option("--out", "-o", help="Report folder.")] = (
            REPRODUCE_OUT
        ),
        paper: str = typer.Option(
            DEFAULT_PAPER, help=f"Which paper to reproduce: {', '.join(PAPERS)}."
        ),
        seeds: str | None = typer.Option(
            None,
            help="Comma-separated seeds (non-negative; ma: 1,2,3, lyreo: 1,2,3, cema: 1-10).",
        ),
        slots: int | None = typer.Option(
            None,
            help="Measured slots per run (ma: 200 a testbed run and bursty phase, as the paper; "
            "lyreo: 400, paper 800; cema: 60 a deployment run).",
        ),
        workers: WorkersOpt = None,
        executor_name: ExecutorOpt = "local",
        address: AddressOpt = None,
        quick: bool = typer.Option(
            False,
            "--quick",
            help="A fast smoke run: seed 1, at most 30 slots (ma: the paper's nine methods "
            "only; lyreo: two-episode trainings, two points a sweep).",
        ),
        policies: str | None = typer.Option(
            None,
            help="Comma-separated profiles to run (default: ma: the paper's nine, cema, "
            "lyreo-greedy; lyreo: its ten profiles).",
        ),
    ) -> None:
        """Regenerate a paper's results on the emulator, side by side with its numbers:
        the MA paper's Figs. 6-9 and Tables II-IV (default), LYREO's Figs. 2-7 and Table II,
        or CEMA-Router's controlled and deployment-like stages."""
        from lmedge.bench.executors import executor_for
        from lmedge.bench.paper_report import timing_note
        from lmedge.bench.papers import Flags
        from lmedge.processes.plugins import register_plugins

        register_plugins()
        repro = reproducer(paper)
        seeds_text = seeds if seeds is not None else ",".join(map(str, repro.seeds))
        slots = repro.slots if slots is None else slots
        if slots < 1:
            raise ConfigError(f"--slots must be at least 1, got {slots}")
        if workers is not None and workers < 1:
            raise ConfigError(f"--workers must be at least 1, got {workers}")
        flags = Flags(_ints(seeds_text, "--seeds"), slots, quick, _names(policies))
        repro.check(flags)  # every mistake in the flags or scenarios surfaces before any run
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

            def done(n: int, total: int, what: str) -> None:
                bar.update(task, completed=n, total=total, description=what)

            result = repro.run(flags, executor, done)
        wall = time.perf_counter() - started
        _print(result)
        parts = [] if paper == DEFAULT_PAPER else [f"--paper {paper}"]
        parts += [f"--seeds {seeds_text}", f"--slots {slots}"]
        if quick:
            parts.append("--quick")
        if policies:
            parts.append(f"--policies {policies}")
        if executor_name == "ray":
            parts.append(f"--executor ray --address {address}")
        command = " ".join(["lmedge reproduce", *parts, f"-o {out_dir}"])
        note = timing_note(result.jobs, count, wall)
        md = repro.write(out_dir, result, command=command, cpu_note=note)
        out.print(note, soft_wrap=True)
        out.print(f"report: {md}", soft_wrap=True)
