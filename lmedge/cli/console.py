"""The CLI's stderr console and the progress bar of every command that runs a grid of runs.

Results go to stdout (tables or JSON); everything a person watches while
waiting goes to stderr, so `--json` output stays parseable.
"""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from lmedge.errors import ConfigError

err = Console(stderr=True)

# The scenario of every command that runs one (simulate, calibrate, calibration-check).
ScenarioOpt = Annotated[
    str,
    typer.Option("--scenario", "-f", help="Scenario folder, or a bundled example name."),
]

# The options of every command that runs a grid of runs (bench, reproduce).
WorkersOpt = Annotated[
    int | None,
    typer.Option(help="Worker processes (default: one per CPU core; 1 runs in this process)."),
]
ExecutorOpt = Annotated[
    str,
    typer.Option(
        "--executor",
        help="Where the runs execute: local (a process pool) or ray (a Ray cluster).",
    ),
]
AddressOpt = Annotated[
    str | None,
    typer.Option(
        help="Ray cluster for --executor ray: HOST:PORT of its head, ray://HOST:10001, auto."
    ),
]


def progress_bar(*, terminal_only: bool = True) -> Progress:
    """A transient bar on stderr: the task's description, the bar, done/total, elapsed time.

    With `terminal_only` the bar is disabled when stderr is not a terminal
    (CI logs, pipes), where redrawing it would only add noise.
    """
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
        transient=True,
        disable=terminal_only and not err.is_terminal,
    )


def parse_seeds(text: str) -> list[int]:
    """`--seeds`: comma-separated non-negative integers, at least one (`ConfigError` if not)."""
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise ConfigError(f"--seeds must be comma-separated integers, got {text!r}") from None
    if not seeds:
        raise ConfigError("--seeds names no seed")
    negative = [s for s in seeds if s < 0]
    if negative:
        raise ConfigError(f"--seeds must be non-negative, got {negative[0]}")
    return seeds
