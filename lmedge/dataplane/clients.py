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
        limits = httpx.Limits(
            max_connections=max_connections, max_keepalive_connections=max_connections
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
        url = base_url.rstrip("/") + "/internal/forward"
        if self._peer_slots is None:
            self._peer_slots = asyncio.Semaphore(self._slots)
        try:
            async with asyncio.timeout(timeout_s), self._peer_slots:
                response = await self._peers.post(
                    url,
                    content=request.model_dump_json(),
                    timeout=self._timeout(timeout_s),
                    headers={"Content-Type": "application/json"},
                )
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
        target = url.rstrip("/") + "/infer"
        if self._model_slots is None:
            self._model_slots = asyncio.Semaphore(self._slots)
        try:
            async with asyncio.timeout(timeout_s), self._model_slots:
                response = await self._models.post(
                    target,
                    content=request.model_dump_json(),
                    timeout=self._timeout(timeout_s),
                    headers={"Content-Type": "application/json"},
                )
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

    async def aclose(self) -> None:
        await self._peers.aclose()
        await self._models.aclose()


def _describe(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
