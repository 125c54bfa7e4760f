"""The CLI's stderr console and the progress bar of every command that runs a grid of runs.

Results go to stdout (tables or JSON); everything a person watches while
waiting goes to stderr, so `--json` output stays parseable.
"""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

err = Console(stderr=True)


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
