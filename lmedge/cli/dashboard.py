"""`lmedge dashboard`: serve the web dashboard over a store.

Opens the store read-only (`--store`, else `$LMEDGE_STORE`, else
`./.lmedge/store`), like `lmedge decisions`. Off a loopback address the
dashboard shows every run and decision to whoever reaches it, so it refuses
to start there without `--token-file` (the users' API token) unless told
`--no-auth` explicitly.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from lmedge.cli.store_cmds import StoreOption
from lmedge.errors import ConfigError

#: Default port: next to the gateway's 8080 range, free in the chart.
DEFAULT_PORT = 8090


def register(app: typer.Typer) -> None:
    @app.command("dashboard")
    def dashboard(
        store: StoreOption = None,
        host: Annotated[
            str, typer.Option(help="Address to listen on (loopback by default).")
        ] = "127.0.0.1",
        port: Annotated[int, typer.Option(help="Port to listen on.")] = DEFAULT_PORT,
        token_file: Annotated[
            Path | None,
            typer.Option(
                "--token-file",
                help="File holding the user token every page then requires "
                "(Bearer header or the /login form).",
            ),
        ] = None,
        no_auth: Annotated[
            bool,
            typer.Option("--no-auth", help="Serve a non-loopback address without a token."),
        ] = False,
        reports: Annotated[
            list[Path] | None,
            typer.Option(
                "--reports",
                help="Folder of report folders (summary.json + figures); repeatable. "
                "Default: ./reports.",
            ),
        ] = None,
        refresh: Annotated[
            int, typer.Option(min=1, help="Seconds between reloads of a live run's pages.")
        ] = 5,
        live_window: Annotated[
            float,
            typer.Option(
                min=1.0, help="A run is live while its newest decision is younger (seconds)."
            ),
        ] = 120.0,
    ) -> None:
        """Serve the web dashboard: runs, metrics, cluster, decisions and reports."""
        from lmedge.cli.dataplane import read_secret
        from lmedge.dashboard import DashboardSettings
        from lmedge.processes import dashboard as root

        token = read_secret(token_file, "--token-file") if token_file else None
        if token is None and not no_auth and not root.is_loopback(host):
            raise ConfigError(
                f"--host {host} is not a loopback address: give --token-file (the users' API "
                "token), or --no-auth to serve every run to whoever reaches it"
            )
        settings = DashboardSettings(
            token=token,
            refresh_s=refresh,
            live_window_s=live_window,
            report_roots=tuple(reports or [Path("reports")]),
        )
        root.main(settings, host=host, port=port, store=store)
