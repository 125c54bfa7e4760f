"""Who may call a gateway: the users' API token and the control credential.

Two credentials, never one standing in for the other:

* the **user token** opens the user API (`/v1/*`); any API user holds it;
* the **control credential** opens `/control/*` (the routing map, the model
  pods serving here, the queue depths) and `/internal/forward` (peer
  gateways). Whoever holds it decides where this node's model traffic goes,
  so it must not be shared with users, nor with other nodes.

In a cluster the control credential is the caller's own projected
service-account token with a dedicated audience (`ServiceAccountAuth`): the
gateway asks the API server who it is (TokenReview) and authorizes by
identity — the controller's account, or the node agent's account whose token
is bound to a pod on *this* node (`authentication.kubernetes.io/node-name`).
A token stolen from one node therefore controls that node's gateway only; for
`/internal/forward` any node's agent account is accepted, since every peer
gateway forwards with it. Outside Kubernetes (local runs, tests) a shared
token read from a file serves (`StaticTokenAuth`).

A gateway with a user token and no control credential refuses to start
(`ApiSettings`): the user token never doubles as the control one. With
neither, every endpoint is open (development only).

The `Authorization` header must use the Bearer scheme (RFC 6750), whose name
is case-insensitive (RFC 9110 §11.1): `bearer x` is accepted, a bare `x`
refused (`lmedge.tokens`, which the dashboard reads its token with too).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Protocol

from fastapi import Header
from starlette.exceptions import HTTPException

from lmedge.errors import ConfigError, LmedgeError
from lmedge.tokens import bearer_token, same_token

__all__ = [
    "NODE_NAME_EXTRA",
    "ControlAuth",
    "Review",
    "ServiceAccountAuth",
    "StaticTokenAuth",
    "TokenReviewer",
    "check_credentials",
    "control_guard",
    "kube_reviewer",
    "service_account_username",
    "user_guard",
]

log = logging.getLogger(__name__)

#: The TokenReview `extra` key naming the node of the pod a token is bound to.
NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"

#: What a control call is for: the control API proper, or a peer's forward.
Scope = Literal["control", "forward"]


class Denied(HTTPException):
    """401 (no or bad credential), 403 (a known caller not allowed here), 503."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(status, message)


class ControlAuth(Protocol):
    """Decides whether a bearer token may make a control call of `scope`."""

    async def authorize(self, token: str, scope: Scope) -> None:
        """Return if allowed; raise `Denied` otherwise."""
        ...


@dataclass(frozen=True)
class StaticTokenAuth:
    """A shared control token (local runs and tests; a cluster uses `ServiceAccountAuth`)."""

    token: str

    def __post_init__(self) -> None:
        if not self.token.strip():
            raise ConfigError("the control token is empty")

    async def authorize(self, token: str, scope: Scope) -> None:
        if not same_token(token, self.token.strip()):
            raise Denied(401, "missing or wrong bearer token")


@dataclass(frozen=True)
class Review:
    """What the API server said about a token (a TokenReview's status)."""

    authenticated: bool
    username: str = ""
    #: The node of the pod the token is bound to; '' for an unbound token.
    node: str = ""
    audiences: tuple[str, ...] = ()
    error: str = ""


#: Asks the API server about `token` for `audiences` (blocking; run in a thread).
TokenReviewer = Callable[[str, list[str]], Review]


class _Reviews(Protocol):
    def review_token(self, token: str, audiences: list[str]) -> dict[str, Any]: ...


def kube_reviewer(kube: _Reviews) -> TokenReviewer:
    """A `TokenReviewer` over the API server (`KubeClient.review_token`)."""

    def review(token: str, audiences: list[str]) -> Review:
        status = kube.review_token(token, audiences)
        user = status.get("user") or {}
        nodes = (user.get("extra") or {}).get(NODE_NAME_EXTRA) or [""]
        return Review(
            authenticated=bool(status.get("authenticated")),
            username=str(user.get("username") or ""),
            node=str(nodes[0]),
            audiences=tuple(str(a) for a in status.get("audiences") or ()),
            error=str(status.get("error") or ""),
        )

    return review


def service_account_username(account: str) -> str:
    """`system:serviceaccount:NS:NAME` from `NS/NAME` (or that username itself)."""
    if account.startswith("system:serviceaccount:"):
        return account
    ns, sep, name = account.partition("/")
    if not sep or not ns or not name or "/" in name:
        raise ConfigError(f"a service account is NAMESPACE/NAME, got {account!r}")
    return f"system:serviceaccount:{ns}:{name}"


@dataclass
class ServiceAccountAuth:
    """Verifies the caller's service-account token (TokenReview) and authorizes it.

    `node` is this gateway's node, `audience` the audience callers' tokens
    must carry (the chart's `lmedge-gateway`), `controller` and `agent` the
    usernames of the controller's and the node agents' service accounts.
    Reviews are cached by a hash of the token, `ttl_s` (default 30 s) when
    the token was accepted and `denied_ttl_s` (default 5 s) when not, so a
    slot's pushes cost one review per caller and a flood of bad tokens does
    not become a flood of reviews; at most `max_cached` entries are kept.
    A token's own expiry is not tracked: a token accepted within `ttl_s`
    before it expires is accepted until its entry expires.
    """

    node: str
    reviewer: TokenReviewer
    audience: str
    controller: str
    agent: str
    ttl_s: float = 30.0
    denied_ttl_s: float = 5.0
    max_cached: int = 1024
    clock: Callable[[], float] = time.monotonic
    _cache: OrderedDict[str, tuple[float, Review]] = field(default_factory=OrderedDict)

    async def authorize(self, token: str, scope: Scope) -> None:
        review = await self._review(token)
        if not review.authenticated or self.audience not in review.audiences:
            # The API server's reason (e.g. the audiences the token carries) is for the
            # operator's log, not for a caller probing with tokens.
            log.warning("control call refused: %s", review.error or "token not for this audience")
            raise Denied(401, "bearer token not accepted by the API server")
        if review.username == self.controller:
            return
        if review.username == self.agent:
            if review.node == self.node or (scope == "forward" and review.node):
                return
            raise Denied(
                403,
                f"the node agent of {review.node or 'no node (unbound token)'} may not "
                f"control the gateway of {self.node}",
            )
        raise Denied(403, f"{review.username} may not call the control API of {self.node}")

    async def _review(self, token: str) -> Review:
        key = hashlib.sha256(token.encode()).hexdigest()
        now = self.clock()
        hit = self._cache.get(key)
        if hit is not None and hit[0] > now:
            return hit[1]
        try:
            review = await asyncio.to_thread(self.reviewer, token, [self.audience])
        except LmedgeError as exc:
            log.warning("TokenReview failed: %s", exc)
            raise Denied(503, "cannot verify the bearer token now (API server)") from exc
        ttl = self.ttl_s if review.authenticated else self.denied_ttl_s
        self._cache[key] = (now + ttl, review)
        self._cache.move_to_end(key)
        while len(self._cache) > self.max_cached:
            self._cache.popitem(last=False)
        return review


def check_credentials(token: str | None, control: ControlAuth | None) -> None:
    """Refuse a user token without a control credential, or equal to the control token.

    One `ConfigError` line each: either would let the user token open the
    control API.
    """
    if token is not None and not token.strip():
        raise ConfigError("the user API token is empty")
    if token and control is None:
        raise ConfigError(
            "a user API token is set but no control credential: give the gateway "
            "--control-token-file or --control-audience (the user token never opens "
            "the control API)"
        )
    if (
        token
        and isinstance(control, StaticTokenAuth)
        and same_token(token.strip(), control.token.strip())
    ):
        raise ConfigError(
            "the user API token and the control token are the same: give the control "
            "API a token of its own (the user token never opens the control API)"
        )


def user_guard(expected: str | None) -> Callable[..., Awaitable[None]]:
    """A FastAPI dependency requiring the user token (none: open)."""

    async def check(authorization: Annotated[str | None, Header()] = None) -> None:
        if expected is None:
            return
        given = bearer_token(authorization)
        if given is None or not same_token(given, expected.strip()):
            raise Denied(401, "missing or wrong bearer token")

    return check


def control_guard(auth: ControlAuth | None, scope: Scope) -> Callable[..., Awaitable[None]]:
    """A FastAPI dependency requiring the control credential for `scope` (none: open)."""

    async def check(authorization: Annotated[str | None, Header()] = None) -> None:
        if auth is None:
            return
        given = bearer_token(authorization)
        if given is None:
            raise Denied(401, "missing or wrong bearer token")
        await auth.authorize(given, scope)

    return check
