"""The `lmedge` command line.

Each command group lives in its own module exposing `register(app)`; they are
listed once in `COMMAND_MODULES`. `main()` turns every `UserError`, and every
flag click refuses, into one line on stderr and exit code 2 — users never see
a traceback for a mistake.
"""

from __future__ import annotations

import importlib
import sys

import typer
from rich.console import Console
from rich.markup import escape

from lmedge.errors import LmedgeError, UserError

COMMAND_MODULES = [
    "lmedge.cli.crds",
    "lmedge.cli.simulate",
    "lmedge.cli.dataplane",
    "lmedge.cli.store_cmds",
    "lmedge.cli.calibrate",
    "lmedge.cli.calibration_check",
    "lmedge.cli.cluster",
    "lmedge.cli.reproduce",
    "lmedge.cli.dashboard",
    "lmedge.cli.policies",
    "lmedge.cli.scenarios",
    "lmedge.cli.cema",
    "lmedge.cli.train",
]

app = typer.Typer(
    name="lmedge",
    help="Control plane for serving many language models on edge GPU clusters.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
err_console = Console(stderr=True)


def version() -> str:
    """The installed distribution's version (the package's own when run from a checkout)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    import lmedge

    try:
        return dist_version("lmedge")
    except PackageNotFoundError:
        return lmedge.__version__


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"lmedge {version()}")
        raise typer.Exit()


@app.callback()
def _root(
    _version: bool = typer.Option(
        False,
        "--version",
        help="Print the version and exit.",
        callback=_print_version,
        is_eager=True,
    ),
) -> None:
    """Control plane for serving many language models on edge GPU clusters."""
    # A callback keeps `lmedge <command>` a group even while only one command exists.


def _register_all() -> None:
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(app)


def main(argv: list[str] | None = None) -> None:
    """Entry point of the `lmedge` console script."""
    _register_all()
    try:
        code = app(args=argv, standalone_mode=False)
        if isinstance(code, int) and code:  # click returns `typer.Exit(n)` codes here
            sys.exit(code)
    except UserError as exc:
        err_console.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False, soft_wrap=True)
        sys.exit(exc.exit_code)
    except LmedgeError as exc:
        err_console.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False, soft_wrap=True)
        sys.exit(1)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        err_console.print("aborted")
        sys.exit(130)
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as exc:  # click usage errors arrive here in non-standalone mode
        # typer >= 0.16 vendors click, so match its exceptions by shape, not class.
        message, code = getattr(exc, "format_message", None), getattr(exc, "exit_code", None)
        if callable(message) and isinstance(code, int):
            # One line, like every other user mistake (click's own form spans three).
            ctx = getattr(exc, "ctx", None)
            where = getattr(ctx, "command_path", "") or "lmedge"
            err_console.print(
                f"[red]error:[/red] {escape(' '.join(str(message()).split()))} "
                f"(see {escape(where)} --help)",
                highlight=False,
                soft_wrap=True,
            )
            sys.exit(code)
        raise
