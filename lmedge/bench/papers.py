"""What a paper's reproduction offers `lmedge reproduce --paper NAME`.

Each paper's module exposes a `REPRODUCER` (this protocol): its default seeds
and slots, a `check` that surfaces every mistake in the flags before any run,
`run` (the grid on a `RunExecutor`, with progress) and `write` (its report
folder). The CLI names the modules in one registry
(`lmedge.cli.reproduce.PAPERS`), so a paper plugs in with one line there.
Not here: what any paper runs or checks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from lmedge.bench.checks import Section
from lmedge.bench.runner import RunExecutor

#: `progress(done, total, what)`: a run (or a training step) has finished.
Progress = Callable[[int, int, str], None]


@dataclass(frozen=True)
class Flags:
    """The flags every reproduction takes, parsed; seeds and slots are the paper's defaults
    when not given."""

    seeds: tuple[int, ...]
    slots: int
    quick: bool
    policies: tuple[str, ...] | None


class Result(Protocol):
    """A finished reproduction: its sections and everything that ran (each with a
    `timing` holding `cpu_s`, for the cost note)."""

    sections: list[Section]

    @property
    def jobs(self) -> Sequence[Any]: ...


class Reproducer(Protocol):
    """One paper's reproduction."""

    #: One line for `--help`.
    summary: str
    seeds: tuple[int, ...]
    slots: int

    def check(self, flags: Flags) -> None:
        """Plan the grid for `flags`; a mistake is a `ConfigError`, before any run."""
        ...

    def run(self, flags: Flags, executor: RunExecutor, progress: Progress) -> Result: ...

    def write(self, out: Path, result: Any, *, command: str, cpu_note: str) -> Path:
        """Write the report folder; returns its REPORT.md."""
        ...
