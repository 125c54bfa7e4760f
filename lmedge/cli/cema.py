"""`lmedge cema`: build CEMA-Router's offline quality store and the dataset it is built from.

`make-dataset` writes the seeded scored-prompt dataset
(`lmedge.policies.cema.dataset`); `build-store` embeds a dataset with
all-MiniLM-L6-v2 (the `cema` extra, loaded offline) and saves the store the
`cema` and `uniroute` routers load (`predictor: store`). Both default to the
files shipped in the package, so running them with no flags regenerates the
committed ones.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from lmedge.errors import ConfigError

app = typer.Typer(help="CEMA-Router's quality store.", no_args_is_help=True)


@app.command("make-dataset")
def make_dataset(
    out: Annotated[
        Path | None, typer.Option(help="Where to write (default: the shipped file).")
    ] = None,
    seed: Annotated[int, typer.Option(help="Generator seed (the shipped file is seed 0).")] = 0,
    per_family: Annotated[int, typer.Option(min=1, help="Prompts per task family.")] = 240,
) -> None:
    """Generate the scored-prompt dataset (JSON lines)."""
    from lmedge.policies.cema import dataset

    path = out or dataset.DATA_FILE
    rows = dataset.generate(seed, per_family)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dataset.dumps(rows))
    typer.echo(f"{len(rows)} prompts -> {path}")


@app.command("build-store")
def build_store(
    data: Annotated[Path | None, typer.Option(help="Dataset (default: the shipped one).")] = None,
    out: Annotated[Path | None, typer.Option(help="Store file (default: the shipped one).")] = None,
) -> None:
    """Embed a dataset's prompts with MiniLM and save the quality store (.npz)."""
    from lmedge.policies.cema import dataset, store
    from lmedge.policies.cema.quality import rag_available

    missing = rag_available()
    if missing:
        raise ConfigError(f"cema build-store: {missing}")
    source = data or dataset.DATA_FILE
    rows = dataset.load(source)
    if not rows:
        raise ConfigError(f"cema build-store: {source} has no prompts")
    built = store.QualityStore.build(rows, store.minilm(), source_sha256=store.file_sha256(source))
    path = out or store.STORE_FILE
    built.save(path)
    typer.echo(f"{len(rows)} prompts x {len(built.models)} models -> {path}")


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="cema")
