"""Running a gateway under uvicorn: a socket bound up front, and a bounded drain.

Two things plain `uvicorn.run` gets wrong for a pod:

* a port it cannot use (out of range, taken, a host that does not resolve) is
  logged, or not at all (port 99999 hangs), instead of failing the command:
  `bind` opens the socket first and turns every such problem into one
  `ConfigError` line (exit 2);
* after SIGTERM it waits for every open request, and a set queued for an LM
  with no pod waits up to tau (900 s), far past the pod's grace period, so the
  kubelet kills the process and the set gets no record. `GatewayServer` waits
  `drain_s` for requests to finish, then has the gateway answer every set
  still waiting (`Gateway.stop_waiting`: outcome `timeout`, error "gateway
  shutting down", a record at the origin), then closes the gateway, which
  flushes the records to the store.

`DEFAULT_DRAIN_S` (20 s) is below the chart's terminationGracePeriodSeconds
(slot length + 30 s, 60 s by default), leaving time for the store flush.
"""

from __future__ import annotations

import asyncio
import logging
import math
import socket
from urllib.parse import urlsplit

import uvicorn

from lmedge.dataplane.gateway import Gateway, GatewaySettings
from lmedge.errors import ConfigError

__all__ = ["DEFAULT_DRAIN_S", "GatewayServer", "bind", "check_urls"]

log = logging.getLogger(__name__)

#: Seconds after SIGTERM during which requests may still finish.
DEFAULT_DRAIN_S = 20.0
#: Seconds after the drain for the answers to be written before uvicorn cancels them.
_ANSWER_S = 5.0


def bind(host: str, port: int, backlog: int = 4096) -> socket.socket:
    """A listening TCP socket on host:port; `ConfigError` naming why when it cannot be."""
    if not 0 < port < 65536:
        raise ConfigError(f"--port must be between 1 and 65535, got {port}")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise ConfigError(f"--host {host!r} does not resolve: {exc.strerror}") from exc
    except UnicodeError as exc:  # a label the IDNA codec refuses (e.g. over 63 characters)
        raise ConfigError(f"--host {host[:80]!r} is not a host name: {exc}") from exc
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(backlog)
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
    sock.set_inheritable(True)
    return sock


def _http_url(url: str) -> bool:
    try:
        parts = urlsplit(url)
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.netloc)


def check_urls(settings: GatewaySettings) -> None:
    """Refuse peer and model URLs a forward could not use (`ConfigError`, one line).

    The gateway core treats URLs as opaque (its tests use fakes); the process
    checks what the user gave it, so a typo fails at start, not every request.
    """
    for what, urls in (("--peer", settings.peers), ("--model-url", settings.model_urls)):
        for name, url in urls.items():
            if not _http_url(url):
                raise ConfigError(f"{what} {name}={url}: not an http(s) URL")
    template = settings.peer_url_template
    if template is None:
        return
    try:
        example = template.format(node="worker-1")
    except (KeyError, IndexError, ValueError) as exc:
        raise ConfigError(
            f"--peer-url-template {template!r}: only {{node}} may be substituted "
            f"({type(exc).__name__}: {exc})"
        ) from None
    if "{node}" not in template or not _http_url(example):
        raise ConfigError(
            f"--peer-url-template {template!r} must be an http(s) URL containing {{node}}, "
            "e.g. http://{node}:8080"
        )


class GatewayServer(uvicorn.Server):
    """uvicorn whose shutdown gives waiting sets an outcome after `drain_s` seconds."""

    def __init__(self, config: uvicorn.Config, gateway: Gateway, drain_s: float) -> None:
        if not 0 <= drain_s < math.inf:
            raise ConfigError(f"--drain-s must be >= 0, got {drain_s:g}")
        config.timeout_graceful_shutdown = int(drain_s + _ANSWER_S + 1)
        super().__init__(config)
        self.gateway = gateway
        self.drain_s = drain_s

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        handle = asyncio.get_running_loop().call_later(self.drain_s, self._stop_waiting)
        try:
            await super().shutdown(sockets)
        finally:
            handle.cancel()

    def _stop_waiting(self) -> None:
        n = self.gateway.stop_waiting()
        if n:
            log.warning(
                "drain of %gs over: %d set(s) still waiting answered as timed out", self.drain_s, n
            )
