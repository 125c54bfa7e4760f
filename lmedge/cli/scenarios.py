"""`lmedge scenarios generate`: write a scenario folder drawn from documented distributions.

The drawing lives in `lmedge.sim.generator`; this module parses the flags,
resolves the LM pool (a shipped services file by default) and writes the
folder. It runs nothing: `lmedge simulate -f DIR` or `lmedge bench -f DIR` do.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from lmedge.bench.runner import resolve_scenario
from lmedge.cli.console import err
from lmedge.sim import load_scenario
from lmedge.sim.generator import DISTRIBUTIONS, Bounds, generate, load_pool

#: The default pool: the testbed's four calibrated LM types in four sizes each.
POOL_SCENARIO = "metro-1000"


def default_pool() -> Path:
    """The shipped services file the generator draws LMs from by default."""
    return resolve_scenario(POOL_SCENARIO) / "services.yaml"


def _help() -> str:
    lines = "\n\n".join(f"- {line}" for line in DISTRIBUTIONS)
    return (
        "Write a scenario folder drawn from these distributions (docs/scenarios.md); "
        "every draw is in its generated.yaml, and the same seed writes the same bytes.\n\n" + lines
    )


def register(app: typer.Typer) -> None:
    scenarios = typer.Typer(
        help="Scenario tools: generate clusters nobody tuned for.", no_args_is_help=True
    )
    app.add_typer(scenarios, name="scenarios")

    @scenarios.command("generate", help=_help())
    def generate_cmd(
        seed: int = typer.Option(..., min=0, help="Generator seed (>= 0)."),
        out_dir: Annotated[
            Path, typer.Option("--out", "-o", help="Folder to write (created; files replaced).")
        ] = Path("scenario"),
        slots: int = typer.Option(200, min=1, help="Run length T the timeline is drawn over."),
        min_workers: int = typer.Option(4, min=1, help="Fewest workers to draw."),
        max_workers: int = typer.Option(60, min=1, help="Most workers to draw."),
        max_sites: int = typer.Option(8, min=1, help="Most sites to draw."),
        pool: Annotated[
            Path | None,
            typer.Option(
                help=f"LMService manifests to draw LMs from (default: examples/{POOL_SCENARIO}'s)."
            ),
        ] = None,
    ) -> None:
        bounds = Bounds(
            min_workers=min_workers, max_workers=max_workers, max_sites=max_sites, slots=slots
        )
        scenario = generate(seed, load_pool(pool or default_pool()), bounds)
        folder = scenario.write(out_dir)
        loaded = load_scenario(folder)  # the folder must load exactly as written
        n_workers = sum(1 for n in loaded.nodes if n.spec.role == "worker")
        err.print(
            f"wrote {folder}: {n_workers} workers, {len(loaded.services)} LMs"
            + (", a timeline" if loaded.timeline is not None else ""),
            highlight=False,
            soft_wrap=True,
        )
