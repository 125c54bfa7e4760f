"""The gateway's HTTP clients (the only dataplane module that imports httpx).

One pooled `httpx.AsyncClient` per purpose, with keep-alive: forwarding to
other nodes' gateways, and calling this node's model pods. Transport failures
are mapped to lmedge errors here, so the rest of the gateway never sees httpx:
unreachable or not-ready pods -> `ModelUnavailable` (retried), other refusals
-> `ModelFailed`; an unreachable peer gateway -> `PeerUnavailable`.

The pool waits for a free connection instead of failing (`pool=None`): the
request's own deadline bounds the wait, and 2,000 concurrent sets must queue,
not error.
"""

from __future__ import annotations

import asyncio

import httpx
from pydantic import ValidationError

from lmedge.api.inference import InferRequest, InferResult
from lmedge.dataplane.queues import ModelFailed, ModelUnavailable
from lmedge.dataplane.wire import ForwardRequest, ForwardResult
from lmedge.errors import TransientError

__all__ = ["HttpClients", "PeerUnavailable"]

#: Retries of a request whose connection failed or was closed before an answer.
_RETRIES = 2
#: Wait before retry n is n x this, seconds.
_BACKOFF_S = 0.05
_RETRYABLE = (
    httpx.ConnectError,
    httpx.ConnectTimeout,
    httpx.ReadError,
    httpx.WriteError,
    httpx.RemoteProtocolError,
)


class PeerUnavailable(TransientError):
    """The destination node's gateway did not answer or refused the set."""


class HttpClients:
    """Pooled clients to peer gateways and local model pods.

    `token` is sent as a bearer token to peer gateways (their control token).
    `max_connections` bounds each pool (default 512). `connect_timeout_s`
    (default 3 s) fails fast on a dead node; read timeouts come per call from
    the request's deadline. The transports are for in-process tests.
    """

    def __init__(
        self,
        *,
        token: str | None = None,
        max_connections: int = 512,
        connect_timeout_s: float = 3.0,
        peer_transport: httpx.AsyncBaseTransport | None = None,
        model_transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        # Idle connections are dropped after 4 s, before uvicorn's default 5 s
        # keep-alive timeout closes them under a request in flight.
        limits = httpx.Limits(
            max_connections=max_connections,
            max_keepalive_connections=max_connections,
            keepalive_expiry=4.0,
        )
        timeout = httpx.Timeout(None, connect=connect_timeout_s, pool=None)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._connect_timeout_s = connect_timeout_s
        # Requests wait for a connection here, not in httpcore's pool: its queue
        # is rescanned on every state change, which is quadratic in the number
        # waiting and stalled 2,000 concurrent sets.
        self._slots = max_connections
        self._peer_slots: asyncio.Semaphore | None = None
        self._model_slots: asyncio.Semaphore | None = None
        self._peers = httpx.AsyncClient(
            limits=limits, timeout=timeout, headers=headers, transport=peer_transport
        )
        self._models = httpx.AsyncClient(limits=limits, timeout=timeout, transport=model_transport)

    def _timeout(self, total_s: float) -> httpx.Timeout:
        return httpx.Timeout(total_s, connect=min(self._connect_timeout_s, total_s), pool=None)

    async def forward(
        self, base_url: str, request: ForwardRequest, timeout_s: float
    ) -> ForwardResult:
        """Hand a prompt set to the destination's gateway and wait for its result."""
        if self._peer_slots is None:
            self._peer_slots = asyncio.Semaphore(self._slots)
        url = base_url.rstrip("/") + "/internal/forward"
        try:
            response = await self._post(self._peers, self._peer_slots, url, request, timeout_s)
        except (httpx.HTTPError, TimeoutError) as exc:
            raise PeerUnavailable(
                f"gateway at {base_url} did not answer: {_describe(exc)}"
            ) from exc
        if response.status_code != 200:
            raise PeerUnavailable(
                f"gateway at {base_url} answered {response.status_code}: {response.text[:200]}"
            )
        try:
            return ForwardResult.model_validate_json(response.content)
        except ValidationError as exc:
            raise PeerUnavailable(f"gateway at {base_url} sent a malformed result") from exc

    async def infer(self, url: str, request: InferRequest, timeout_s: float) -> InferResult:
        """Run a prompt set on a model pod."""
        if self._model_slots is None:
            self._model_slots = asyncio.Semaphore(self._slots)
        target = url.rstrip("/") + "/infer"
        try:
            response = await self._post(self._models, self._model_slots, target, request, timeout_s)
        except (httpx.HTTPError, TimeoutError) as exc:
            raise ModelUnavailable(f"model server at {url}: {_describe(exc)}") from exc
        if response.status_code in (502, 503, 504):
            raise ModelUnavailable(f"model server at {url} not ready ({response.status_code})")
        if response.status_code != 200:
            raise ModelFailed(f"{response.status_code}: {response.text[:200]}")
        try:
            return InferResult.model_validate_json(response.content)
        except ValidationError as exc:
            raise ModelFailed(f"model server at {url} sent a malformed result") from exc

    async def _post(
        self,
        client: httpx.AsyncClient,
        slots: asyncio.Semaphore,
        url: str,
        body: ForwardRequest | InferRequest,
        timeout_s: float,
    ) -> httpx.Response:
        """POST with up to `_RETRIES` retries of a connection lost before an answer.

        A pooled keep-alive connection can be closed by the server just as a
        request is written on it (a ReadError / RemoteProtocolError with no
        response). Retrying is safe: sets are identified by id, and a model
        server resumes a set it has seen. The whole call stays within `timeout_s`.
        """
        content = body.model_dump_json()
        headers = {"Content-Type": "application/json"}
        async with asyncio.timeout(timeout_s), slots:
            for attempt in range(_RETRIES + 1):
                try:
                    return await client.post(
                        url, content=content, headers=headers, timeout=self._timeout(timeout_s)
                    )
                except _RETRYABLE:
                    if attempt == _RETRIES:
                        raise
                    await asyncio.sleep(_BACKOFF_S * (attempt + 1))
        raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises

    async def aclose(self) -> None:
        await self._peers.aclose()
        await self._models.aclose()


def _describe(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
