"""`lmedge calibration-check`: a scenario's distance from the paper's published facts.

Runs the scenario under the paper's reference conditions (the pre-benchmark,
random routing + deployment, MILP, MA; see `lmedge.bench.calibration`) for a
few seeds and prints, for each fact, the paper's value, lmedge's and the
distance. A report: it exits 0 however far the scenario is, and non-zero
only on an error (a bad scenario or option).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from lmedge.bench.calibration import PRE_POLICY, PRE_SLOTS, CheckSpec, Row, check, rows_json
from lmedge.bench.runner import resolve_scenario
from lmedge.cli.console import ScenarioOpt, parse_seeds, progress_bar
from lmedge.controller.catalog import profile
from lmedge.errors import ConfigError
from lmedge.processes.plugins import register_plugins

out = Console()


def _num(x: float | None, unit: str = "") -> str:
    if x is None:
        return "n/a"
    ax = abs(x)
    text = (
        f"{x:.0f}"
        if ax >= 100
        else f"{x:.1f}"
        if ax >= 10
        else f"{x:.2f}"
        if ax >= 1
        else f"{x:.3g}"
    )
    return f"{text} {unit}".rstrip()


def _table(rows: list[Row], title: str) -> Table:
    table = Table(title=escape(title))
    for name, justify in (
        ("fact", "left"),
        ("paper", "right"),
        ("lmedge", "right"),
        ("delta", "right"),
        ("rel.", "right"),
        ("bound", "left"),
        ("source", "left"),
    ):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for r in rows:
        f = r.fact
        rel = "n/a" if r.relative is None else f"{r.relative:+.0%}"
        bound = {None: "", True: "holds", False: "VIOLATED"}[r.holds]
        paper = _num(f.paper, f.unit)
        table.add_row(
            escape(f.text),
            paper if f.relation == "~" else f"{f.relation} {paper}",
            _num(r.value, f.unit),
            "n/a" if r.delta is None else f"{r.delta:+.3g}",
            rel,
            bound,
            f.source,
        )
    return table


def register(app: typer.Typer) -> None:
    @app.command("calibration-check")
    def calibration_check(
        scenario: ScenarioOpt = "testbed",
        seeds: str = typer.Option("1,2,3", help="Comma-separated seeds; requests are pooled."),
        slots: int = typer.Option(200, help="Slots of the rr, milp and ma runs."),
        pre_slots: int = typer.Option(PRE_SLOTS, help="Slots of the pre-benchmark run."),
        pre_policy: str = typer.Option(
            PRE_POLICY, help="Profile of the pre-benchmark (the paper does not name one)."
        ),
        workers: int | None = typer.Option(
            None,
            min=1,
            max=256,
            help="Worker processes, 1-256 (default: one per CPU core, at most one per run).",
        ),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
        out_path: str | None = typer.Option(
            None, "--out", "-o", help="Also write the report as JSON to this file."
        ),
    ) -> None:
        """Compare a scenario with the paper's published facts (a report; exit 0 unless error)."""
        register_plugins()
        profile(pre_policy)  # an unknown profile fails here, before any run
        if out_path is not None and not Path(out_path).resolve().parent.is_dir():
            raise ConfigError(f"cannot write --out {out_path}: no such directory")
        if out_path is not None and Path(out_path).is_dir():
            raise ConfigError(f"cannot write --out {out_path}: it is a directory")
        seed_list = tuple(parse_seeds(seeds))
        runs = (1 + 3) * len(seed_list)
        count = min(runs, os.cpu_count() or 1) if workers is None else workers
        spec = CheckSpec(
            scenario=resolve_scenario(scenario),
            seeds=seed_list,
            slots=slots,
            pre_slots=pre_slots,
            pre_policy=pre_policy,
            workers=count,
        )
        bar = progress_bar()
        with bar:
            task = bar.add_task("runs", total=runs)
            rows = check(
                spec,
                lambda done, total: bar.update(task, completed=done, total=total),
                setup=register_plugins,
            )
        report = json.dumps(rows_json(spec, rows), ensure_ascii=False, indent=2)
        if out_path is not None:
            try:
                Path(out_path).write_text(report + "\n")
            except OSError as exc:
                raise ConfigError(f"cannot write --out {out_path}: {exc.strerror}") from exc
        if as_json:
            out.print_json(report)
            return
        title = (
            f"{spec.scenario.name} vs the paper · seeds {seeds} · {slots} slots "
            f"(pre-benchmark: {pre_policy}, {pre_slots} slots)"
        )
        out.print(_table(rows, title))
        out.print(
            "delta = lmedge - paper, rel. = delta / paper; a bound row says whether lmedge "
            "keeps the paper's bound. Runs: pre = the pre-benchmark, rr = random routing + "
            "deployment, milp, ma; lmedge/bench/calibration.py explains each fact."
        )
