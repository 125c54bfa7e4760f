"""`lmedge crds`: write the CRD YAML generated from `lmedge.api` into `crds/`."""

from __future__ import annotations

from pathlib import Path

import typer

from lmedge.errors import LmedgeError


def register(app: typer.Typer) -> None:
    @app.command("crds")
    def crds(
        out: Path = typer.Option(Path("crds"), "--out", "-o", help="Folder to write into."),
        check: bool = typer.Option(False, help="Fail if the files on disk differ."),
    ) -> None:
        """Generate the LMService / EdgeNode CRDs from the pydantic models."""
        try:
            from lmedge.api import crds as gen
        except ImportError as exc:  # pragma: no cover - until the generator lands
            raise LmedgeError("the CRD generator (lmedge.api.crds) is not built yet") from exc
        changed = gen.write_crds(out, check=check)
        for path in changed:
            typer.echo(f"{'differs' if check else 'wrote'} {path}")
        if check and changed:
            raise typer.Exit(1)
