"""The dashboard's login sessions: a signed cookie value instead of the API token.

After `/login` the browser holds `<issued>.<nonce>.<signature>`, where the
signature is an HMAC-SHA256, keyed by a secret of this process (or one
configured, so replicas agree), over the issue time, the nonce and a digest
of the token the login proved. The cookie therefore never carries the token
(a stolen cookie is not the users' API token, which also opens every
gateway), expires after `SESSION_TTL_S`, and stops working when the process
restarts with a fresh secret or the token changes.

Not here: which pages need a session (the app's guard) or the token itself
(`DashboardSettings.token`).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Callable
from typing import Final

__all__ = ["SESSION_TTL_S", "Sessions"]

#: How long a login lasts, seconds: a working day, then the form again.
SESSION_TTL_S: Final = 12 * 3600.0


class Sessions:
    """Issues and checks session cookie values for one token."""

    def __init__(
        self,
        token: str,
        secret: bytes | None = None,
        *,
        ttl_s: float = SESSION_TTL_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """`secret`: the HMAC key (default: 32 random bytes, for this process only)."""
        self._key = secret if secret is not None else secrets.token_bytes(32)
        self._token_digest = hashlib.sha256(token.encode()).digest()
        self._ttl_s = ttl_s
        self._clock = clock

    def _sign(self, payload: str) -> str:
        mac = hmac.new(self._key, payload.encode() + self._token_digest, hashlib.sha256)
        return mac.hexdigest()

    def issue(self) -> str:
        """A fresh cookie value."""
        payload = f"{int(self._clock())}.{secrets.token_urlsafe(16)}"
        return f"{payload}.{self._sign(payload)}"

    def valid(self, value: str) -> bool:
        """Whether `value` is a cookie this issuer signed, not yet expired."""
        issued, dot, rest = value.partition(".")
        nonce, dot2, signature = rest.partition(".")
        if not (dot and dot2 and issued.isdigit() and nonce and signature):
            return False
        if not hmac.compare_digest(signature, self._sign(f"{issued}.{nonce}")):
            return False
        age = self._clock() - int(issued)
        return 0 <= age <= self._ttl_s
