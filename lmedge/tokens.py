"""Bearer tokens on the wire: read from a request, compared, sent with one.

Every process that takes or sends a token uses these: the gateways read the
user token and the control credential (`lmedge.dataplane.auth`), the
dashboard reads the user token (`lmedge.dashboard.app`), and the control
plane's and the gateways' HTTP clients send the control credential
(`lmedge.backends.kubernetes.gateways`, `lmedge.dataplane.clients`). One
home, below all of them, so a token is parsed and compared the same way
wherever it arrives.

The `Authorization` header must use the Bearer scheme (RFC 6750), whose name
is case-insensitive (RFC 9110 §11.1): `bearer x` is a token, a bare `x` none.

Not here: who may do what with a token (`lmedge.dataplane.auth`), nor how a
process finds its token files (its flags and settings).
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
from collections.abc import Generator
from pathlib import Path

import httpx

from lmedge.errors import ConfigError

__all__ = ["BearerToken", "bearer_token", "same_token"]

log = logging.getLogger(__name__)


def bearer_token(header: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header, else None.

    The scheme is matched case-insensitively (RFC 9110 §11.1); a header
    without it, another scheme, or a token with spaces in it is no token.
    """
    if not header:
        return None
    scheme, _, rest = header.strip().partition(" ")
    token = rest.strip()
    if scheme.lower() != "bearer" or not token or any(c.isspace() for c in token):
        return None
    return token


def same_token(given: str, expected: str) -> bool:
    """Whether `given` is `expected`, in time independent of where they differ."""
    return secrets.compare_digest(given.encode(), expected.encode())


class BearerToken(httpx.Auth):
    """`Authorization: Bearer <token>` from a string or a token file.

    A file is re-read when it changes: the kubelet rotates a projected
    service-account token in place, and a client holding the first one would
    be refused once it expires. A file that cannot be read, or is empty, is a
    `ConfigError` at construction (one line, before anything starts).
    """

    def __init__(self, source: str | Path) -> None:
        self._path = source if isinstance(source, Path) else None
        self._token = "" if self._path else str(source).strip()
        self._stamp: tuple[int, int] | None = None
        self._lock = threading.Lock()
        if not self.token():
            where = f" in {self._path}" if self._path else ""
            raise ConfigError(f"the bearer token{where} is empty")

    def token(self) -> str:
        """The current token (re-read from the file when its mtime or size changed)."""
        if self._path is None:
            return self._token
        with self._lock:
            try:
                st = os.stat(self._path)
                stamp = (st.st_mtime_ns, st.st_size)
                if stamp != self._stamp:
                    self._token = self._path.read_text().strip()
                    self._stamp = stamp
            except OSError as exc:
                if not self._token:
                    raise ConfigError(f"cannot read the token file {self._path}: {exc}") from exc
                log.warning("token file %s unreadable, keeping the last token: %s", self._path, exc)
            return self._token

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        request.headers["Authorization"] = f"Bearer {self.token()}"
        yield request
