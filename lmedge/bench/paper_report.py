"""The report folder of `lmedge reproduce`: `REPORT.md`, `summary.json`, figures.

Layout:

    REPORT.md           every ordering of the paper with holds / does not hold,
                        then one part per figure or table: side-by-side
                        tables, the checks, the figure
    summary.json        the options, the grid, every run summary, the sections
                        and the figure series: deterministic, so two runs with
                        the same options give the same bytes
    timing.json         wall-clock and CPU seconds per run (these vary)
    fig6-testbed.{png,svg}  fig7-testbed.*  fig8-testbed.*  fig9-bursty.*

The bench report (`lmedge.bench.report`) tabulates any set of runs; this one
is specific to the paper's comparisons.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from lmedge.bench import plots
from lmedge.bench.checks import Check, Section, TableData
from lmedge.bench.environment import environment
from lmedge.bench.grid import Experiment
from lmedge.bench.paper import EXTRAS
from lmedge.bench.reproduce import Reproduction
from lmedge.bench.stats import ROLLING_STEP_SLOTS
from lmedge.bench.summary import dumps, rounded
from lmedge.sim import load_scenario

FORMATS = ("png", "svg")


def verdict(check: Check) -> str:
    """holds / does not hold / not evaluated."""
    return {True: "holds", False: "does not hold", None: "not evaluated"}[check.holds]


def _cell(x: Any) -> str:
    return "–" if x is None else str(x).replace("|", "\\|")


def markdown_table(t: TableData) -> list[str]:
    lines = [f"**{t.title}**", "", "| " + " | ".join(t.header) + " |"]
    lines.append("|" + "---|" * len(t.header))
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in t.rows]
    return [*lines, ""]


def _checks_table(checks: Sequence[Check], with_ref: bool) -> list[str]:
    header = ["claim", *(["where"] if with_ref else []), "verdict", "lmedge's numbers"]
    rows = [
        [c.claim, *([c.ref] if with_ref else []), f"**{verdict(c)}**", c.reason] for c in checks
    ]
    return markdown_table(TableData("", tuple(header), tuple(tuple(r) for r in rows)))[2:]


def _experiment(e: Experiment) -> dict[str, Any]:
    return {
        "scenario": e.scenario,
        "policies": list(e.policies),
        "seeds": list(e.seeds),
        "slots": e.slots,
        "phases": [list(p) for p in e.phases],
    }


def payload(repro: Reproduction) -> dict[str, Any]:
    """The deterministic content of `summary.json`."""
    return {
        "options": dataclasses.asdict(repro.options),
        "experiments": [_experiment(e) for e in repro.experiments],
        "sections": [dataclasses.asdict(s) for s in repro.sections],
        "series": rounded(repro.series),
        "runs": [r.summary for r in repro.runs],
    }


def render(repro: Reproduction, command: str, cpu_note: str) -> str:
    """REPORT.md."""
    o = repro.options
    lines = [
        "# The paper's §VI evidence, regenerated on lmedge's emulator",
        "",
        f"Command: `{command}` — seeds {', '.join(map(str, o.seeds if not o.quick else (1,)))}, "
        f"{repro.experiments[0].slots if repro.experiments else '?'} measured slots per "
        "testbed run (each bursty phase as long), every run followed by settle slots until "
        "its requests have an outcome.",
        "",
        "`ma` and `mal` run the agents' deterministic rule backends (no LLM endpoint was "
        "configured), so \"MA\" here is lmedge's MA, not the paper's GPT-driven one. The "
        "paper measured a physical testbed; lmedge measures an emulator calibrated to the "
        "paper's published facts. Compare ratios and orderings, not absolute seconds.",
        "",
        "Reading: latency is the LM-mean (the unweighted mean of the per-LM mean latencies, "
        "as the paper's headline uses it) unless marked request-weighted; Jain and J are means "
        "over 10-slot windows; lower J is better. `paper / lmedge` cells put the paper's value "
        "first; – is a value the paper does not print (or lmedge could not measure).",
        "",
        cpu_note,
        "",
    ]
    return "\n".join(lines + body(repro.sections))


def body(sections: Sequence[Section]) -> list[str]:
    """What every paper's REPORT.md has after its introduction: the orderings with their
    verdicts, lmedge's targets (when a section keyed `targets` holds them), then one part
    per section (its tables, its checks, its figures)."""
    every = [c for s in sections if s.key != "targets" for c in s.checks]
    held = sum(1 for c in every if c.holds)
    targets = [c for s in sections if s.key == "targets" for c in s.checks]
    lines = [
        f"## The paper's orderings: {held} of {len(every)} hold",
        "",
        *_checks_table(every, with_ref=True),
    ]
    if any(s.key == "targets" for s in sections):
        lines += [
            f"## lmedge's targets: {sum(1 for c in targets if c.holds)} of {len(targets)} met",
            "",
            *_checks_table(targets, with_ref=False),
        ]
    for s in sections:
        lines += [f"## {s.title}", "", f"*{s.ref}.* {s.note}".rstrip(), ""]
        for t in s.tables:
            lines += markdown_table(t)
        if s.checks:
            lines += _checks_table(s.checks, with_ref=False)
        lines += [f"![{f}]({f}.png)" for f in s.figures]
        lines.append("")
    return lines


def _tau(e: Experiment) -> float:
    return load_scenario(e.path, **e.overrides).spec.loop.tau_s


def figures(repro: Reproduction, out: Path, formats: Sequence[str] = FORMATS) -> list[Path]:
    """Write the figures the sections name; returns the files written."""
    written: list[Path] = []
    by = {e.scenario: e for e in repro.experiments}
    tb = by.get("testbed")
    runs = [r.summary for r in repro.runs if r.summary["scenario"] == "testbed"]
    if tb is not None and runs:
        tau = _tau(tb)
        extras = [p for p in tb.policies if p in EXTRAS]
        plots.fig6(
            runs,
            out / "fig6-testbed",
            "Fig. 6 analog: testbed, windows of every seed pooled",
            tau_s=tau,
            marked=extras,
            formats=formats,
        )
        plots.fig7(
            runs,
            out / "fig7-testbed",
            "Fig. 7 analog: per-LM latency and success, testbed",
            tau_s=tau,
            formats=formats,
        )
        written += [out / f"fig6-testbed.{f}" for f in formats]
        written += [out / f"fig7-testbed.{f}" for f in formats]
    if repro.series.get("fig8"):
        plots.fig8(
            repro.series["fig8"],
            out / "fig8-testbed",
            "Fig. 8 analog: rolling objective, testbed",
            formats=formats,
        )
        written += [out / f"fig8-testbed.{f}" for f in formats]
    if repro.series.get("fig9"):
        plots.fig9_bursty(
            repro.series["fig9_arrivals"],
            repro.series["fig9"],
            repro.series["fig9_phases"],
            ROLLING_STEP_SLOTS,
            out / "fig9-bursty",
            "Fig. 9 analog: bursty trace",
            formats=formats,
        )
        written += [out / f"fig9-bursty.{f}" for f in formats]
    return written


def write(
    out: Path,
    repro: Reproduction,
    *,
    command: str,
    cpu_note: str,
    formats: Sequence[str] = FORMATS,
) -> Path:
    """Write the report folder `out` (created if needed); returns `out/REPORT.md`."""
    out.mkdir(parents=True, exist_ok=True)
    figures(repro, out, formats)
    timing = [
        {
            "scenario": r.summary["scenario"],
            "policy": r.summary["policy"],
            "seed": r.summary["seed"],
            **r.timing,
        }
        for r in repro.runs
    ]
    return write_folder(
        out, payload(repro), timing, lambda note: render(repro, command, note), cpu_note
    )


def write_folder(
    out: Path,
    summary: dict[str, Any],
    timing: Sequence[dict[str, Any]],
    markdown: Callable[[str], str],
    cpu_note: str,
) -> Path:
    """The files every paper's report folder has: `summary.json` (deterministic),
    `timing.json`, `environment.json` and `REPORT.md`, whose text `markdown` renders from
    the cost note and the environment sentence. Returns `out/REPORT.md`."""
    (out / "summary.json").write_text(dumps(summary))
    (out / "timing.json").write_text(json.dumps(list(timing), indent=2) + "\n")
    env = environment()
    (out / "environment.json").write_text(json.dumps(env.as_dict(), indent=2) + "\n")
    md = out / "REPORT.md"
    md.write_text(markdown(f"{cpu_note}\n\nEnvironment: {env.sentence()}"))
    return md


def timing_note(runs: Sequence[Any], workers: int, wall_s: float) -> str:
    """One sentence on the cost: CPU seconds of all runs, the wall time, the 2-core estimate.

    The estimate (total CPU / cores) is what a pool of that many otherwise idle
    cores needs, since runs are independent and CPU-bound.
    """
    cpu = sum(r.timing.get("cpu_s") or 0.0 for r in runs)
    longest = max((r.timing.get("cpu_s") or 0.0 for r in runs), default=0.0)
    two = max(cpu / 2, longest)
    return (
        f"Cost: {len(runs)} runs, {cpu:.0f} CPU-s in all (longest run {longest:.0f} s); "
        f"wall {wall_s:.0f} s with {workers} worker(s); on 2 idle cores ≈ {two:.0f} s."
    )
