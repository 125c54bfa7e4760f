"""The report folder of `lmedge reproduce --paper lyreo`.

Layout (the files and the body of REPORT.md are the MA report's,
`lmedge.bench.paper_report.write_folder` and `body`):

    REPORT.md           LYREO's orderings with holds / does not hold / not
                        evaluated, then one part per figure or table
    summary.json        the options, the cells, the policies used, every run
                        summary, the training curves, the sections and the
                        figure series: deterministic for the same options
    timing.json         wall-clock and CPU seconds per run and training
    environment.json    the machine
    fig2-convergence.{png,svg}  fig3-distributions.*  fig4-users.*  fig5-servers.*
    fig6-heterogeneity.*  fig7-sensitivity.*
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lmedge.bench import lyreo_plots
from lmedge.bench.lyreo_repro import LyreoReproduction
from lmedge.bench.paper_report import FORMATS, body, write_folder
from lmedge.bench.summary import rounded


def payload(repro: LyreoReproduction) -> dict[str, Any]:
    """The deterministic content of `summary.json`."""
    p = repro.plan
    return {
        "paper": "lyreo",
        "options": dataclasses.asdict(p.options),
        "cells": [
            {
                "key": c.key,
                "scenario": str(c.path.name),
                "policies": list(c.policies),
                "overrides": c.overrides,
                "router": c.router,
            }
            for c in p.cells
        ],
        "axes": {k: [list(pt) for pt in v] for k, v in p.axes.items()},
        "policies": repro.policies,
        "training_skipped": repro.training_skipped,
        "trainings": {t.key: rounded(t.curve) for t in repro.trainings},
        "sections": [dataclasses.asdict(s) for s in repro.sections],
        "series": rounded(repro.series),
        "runs": [{"cell": key, **r.summary} for key, r in repro.runs],
    }


def render(repro: LyreoReproduction, command: str, cpu_note: str) -> str:
    """REPORT.md."""
    o = repro.plan.options
    lines = [
        "# LYREO's §V evidence, regenerated on lmedge's emulator",
        "",
        f"Command: `{command}` — seeds {', '.join(map(str, o.seeds))}, {o.slots} measured "
        f"1-s slots per run (paper: 800), every run followed by settle slots until its "
        f"requests have an outcome; trainings (Figs. 2 and 7b) of {o.episodes} episodes x "
        f"{o.train_slots} slots, seed {o.seeds[0]}. Sweeps: users "
        f"{', '.join(map(str, o.users))}; servers {', '.join(map(str, o.servers))}; "
        f"ν {', '.join(f'{x:g}' for x in o.nus)}; H {', '.join(map(str, o.horizons))}.",
        "",
        "The paper simulates vLLM-profiled servers; lmedge runs its token-level emulator on "
        "examples/lyreo (every value there documented as the paper's or an assumption). "
        "Compare orderings and ratios, not absolute seconds. Each value is a mean over seeds "
        "of the run summary's `balance`: mean / P99 end-to-end latency of successes, load "
        "deviation Y, virtual-queue length Z (ε = 0.01), high-KV share (server-time with at "
        "least 90% of the KV pool in use). `paper / lmedge` cells put the paper's value "
        "first; – is a value the paper does not print (or lmedge could not measure).",
        "",
        "Learned profiles: "
        + "; ".join(f"`{p}`: {what}" for p, what in repro.policies.items())
        + ".",
        "",
        cpu_note,
        "",
    ]
    return "\n".join(lines + body(repro.sections))


def figures(repro: LyreoReproduction, out: Path, formats: Sequence[str] = FORMATS) -> list[Path]:
    """Write the figures the sections name; returns the files written."""
    s = repro.series
    written: list[Path] = []
    if s.get("fig2"):
        written += lyreo_plots.convergence(
            s["fig2"], out / "fig2-convergence", "Fig. 2 analog: tiny trainings", formats
        )
    if s.get("fig3"):
        written += lyreo_plots.distributions(
            s["fig3"], out / "fig3-distributions", "Fig. 3 analog: mix moderate", formats
        )
    for key, axis, name in (("fig4", "users", "fig4-users"), ("fig5", "servers", "fig5-servers")):
        if s.get(key) and s[key]["points"]:
            written += lyreo_plots.sweep(
                s[key], axis, out / name, f"Fig. {key[-1]} analog: {axis}", formats
            )
    if s.get("fig6"):
        written += lyreo_plots.heterogeneity(
            s["fig6"], out / "fig6-heterogeneity", "Fig. 6 analog: hardware mixes", formats
        )
    if s.get("fig7_nu") or s.get("fig7_h"):
        written += lyreo_plots.sensitivity(
            s.get("fig7_nu"),
            s.get("fig7_h"),
            out / "fig7-sensitivity",
            "Fig. 7 analog: ν and H",
            formats,
        )
    return written


def write(
    out: Path,
    repro: LyreoReproduction,
    *,
    command: str,
    cpu_note: str,
    formats: Sequence[str] = FORMATS,
) -> Path:
    """Write the report folder `out` (created if needed); returns `out/REPORT.md`."""
    out.mkdir(parents=True, exist_ok=True)
    figures(repro, out, formats)
    timing = [
        {"cell": key, "policy": r.summary["policy"], "seed": r.summary["seed"], **r.timing}
        for key, r in repro.runs
    ]
    timing += [{"training": t.key, **t.timing} for t in repro.trainings]
    return write_folder(
        out, payload(repro), timing, lambda note: render(repro, command, note), cpu_note
    )
