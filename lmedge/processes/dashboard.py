"""The `lmedge dashboard` process: the web dashboard over one store, read-only.

The composition root of the dashboard: `main` binds the socket, opens the
store read-only and serves `lmedge.dashboard`'s app under uvicorn until
Ctrl-C. `lmedge dashboard` only parses and checks its flags (a non-loopback
address needs a token, or `--no-auth`) into `DashboardSettings`.
"""

from __future__ import annotations

import ipaddress

import uvicorn
from rich.console import Console

from lmedge.dashboard import DashboardSettings, create_app
from lmedge.dataplane.serving import bind
from lmedge.store import open_store

__all__ = ["is_loopback", "main"]


def is_loopback(host: str) -> bool:
    """True for `localhost` and loopback addresses (127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def main(settings: DashboardSettings, *, host: str, port: int, store: str | None) -> None:
    """The `lmedge dashboard` process: serve `store` (None: `$LMEDGE_STORE`, else
    `./.lmedge/store`) on host:port until stopped."""
    sock = bind(host, port)
    db = open_store(store, read_only=True)
    try:
        shown = "localhost" if is_loopback(host) else host
        Console(stderr=True).print(
            f"lmedge dashboard on http://{shown}:{sock.getsockname()[1]}/ "
            f"({db.where}{', token required' if settings.token else ''}); Ctrl-C stops it",
            highlight=False,
            soft_wrap=True,
        )
        uvicorn.Server(uvicorn.Config(create_app(db, settings), log_level="warning")).run(
            sockets=[sock]
        )
    finally:
        db.close()
        sock.close()
