"""`lmedge crds`: write the CRD YAML generated from `lmedge.api` into `crds/`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from lmedge.api.crds import write_crds
from lmedge.errors import ConfigError


def register(app: typer.Typer) -> None:
    @app.command("crds")
    def crds(
        out: Annotated[Path, typer.Option("--out", "-o", help="Folder to write into.")] = Path(
            "crds"
        ),
        check: Annotated[
            bool,
            typer.Option("--check", help="Write nothing; exit 1 if a file is missing or differs."),
        ] = False,
    ) -> None:
        """Generate the LMService / EdgeNode CRDs from the pydantic models."""
        try:
            changed = write_crds(out, check=check)
        except OSError as exc:  # --out names a file, or a folder that cannot be created
            raise ConfigError(f"--out {out}: {exc.strerror or exc}") from exc
        for path in changed:
            typer.echo(f"{'out of date' if check else 'wrote'} {path}")
        if check and changed:
            typer.echo("run `lmedge crds` to regenerate", err=True)
            raise typer.Exit(1)
