"""`lmedge reproduce`: the paper's §VI evidence regenerated on lmedge's emulator.

One grid of runs (`lmedge.bench.grid`: scenario x policy x seed, identical
traces per scenario and seed) feeds every comparison; `reproduce` performs it
with any `RunExecutor` (a process pool by default in the CLI) and evaluates
it (`lmedge.bench.evaluation`). Nothing is tuned to the paper: a claim that
does not hold on lmedge's numbers is reported as not holding, with the
numbers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lmedge.bench.checks import Section
from lmedge.bench.evaluation import evaluate
from lmedge.bench.grid import Experiment, Options, plan, specs
from lmedge.bench.papers import Flags, Progress
from lmedge.bench.runner import RunData, RunExecutor


@dataclass
class Reproduction:
    """Everything `lmedge reproduce` produced: the grid, its runs and the evaluation."""

    options: Options
    experiments: list[Experiment]
    runs: list[RunData]
    sections: list[Section] = field(default_factory=list)
    #: Figure series: {"fig8": {policy: rolling}, "fig9": {...}, "fig9_arrivals": {...}}.
    series: dict[str, Any] = field(default_factory=dict)

    @property
    def jobs(self) -> Sequence[RunData]:
        """Everything that ran (for the cost note): the runs."""
        return self.runs


def reproduce(
    options: Options,
    executor: RunExecutor,
    on_done: Callable[[int, int, RunData], None] | None = None,
) -> Reproduction:
    """Run the grid of `options` with `executor` and evaluate it.

    `on_done(done, total, data)` reports progress in the caller's process.
    """
    experiments = plan(options)
    grid = specs(experiments)
    count = [0]

    def done(_: int, data: RunData) -> None:
        count[0] += 1
        if on_done:
            on_done(count[0], len(grid), data)

    runs = executor.map(grid, done)
    order = {
        (e.scenario, p): (i, j) for i, e in enumerate(experiments) for j, p in enumerate(e.policies)
    }
    runs.sort(
        key=lambda r: (
            *order.get((r.summary["scenario"], r.summary["policy"]), (99, 99)),
            r.summary["seed"],
        )
    )
    sections, series = evaluate(experiments, runs)
    return Reproduction(options, experiments, runs, sections, series)


class MaReproducer:
    """`lmedge reproduce --paper ma` (the default): this module behind `lmedge.bench.papers`."""

    summary = "ma (default): the MA paper's Figs. 6-9 and Tables II-IV"
    seeds = (1, 2, 3)
    slots = 200

    def options(self, flags: Flags) -> Options:
        return Options(flags.seeds, flags.slots, flags.quick, flags.policies)

    def check(self, flags: Flags) -> None:
        plan(self.options(flags))

    def run(self, flags: Flags, executor: RunExecutor, progress: Progress) -> Reproduction:
        def done(n: int, total: int, data: RunData) -> None:
            s = data.summary
            progress(n, total, f"{s['scenario']} {s['policy']} s{s['seed']}")

        return reproduce(self.options(flags), executor, done)

    def write(self, out: Path, result: Any, *, command: str, cpu_note: str) -> Path:
        from lmedge.bench import paper_report  # it imports this module

        return paper_report.write(out, result, command=command, cpu_note=cpu_note)


REPRODUCER = MaReproducer()
