"""The gateway's HTTP clients (the only dataplane module that imports httpx).

One pooled `httpx.AsyncClient` per purpose, with keep-alive: forwarding to
other nodes' gateways, and calling this node's model pods. Transport failures
are mapped to lmedge errors here, so the rest of the gateway never sees httpx:
unreachable or not-ready pods -> `ModelUnavailable` (retried), other refusals
-> `ModelFailed`; an unreachable peer gateway -> `PeerUnavailable`.

The pool waits for a free connection instead of failing (`pool=None`): the
request's own deadline bounds the wait, and 2,000 concurrent sets must queue,
not error.

Streams (`stream_pod`, `forward_stream`) are read line by line as they
arrive, never buffered whole, and are not retried: a pod or peer that fails
after the first byte fails the stream (`ModelFailed` / `PeerUnavailable`).
Closing the iterator early closes the connection, which the pod or peer sees
as its client leaving (it stops generating and frees the pod).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
from pydantic import ValidationError

from lmedge.api.inference import InferRequest, InferResult
from lmedge.dataplane.engines import EngineCall, Finish, Piece, PodStreamProtocol
from lmedge.dataplane.queues import ModelFailed, ModelUnavailable
from lmedge.dataplane.sse import MalformedStream, SseDecoder
from lmedge.dataplane.wire import (
    ForwardRequest,
    ForwardResult,
    StreamEnd,
    StreamForward,
    StreamStart,
    StreamText,
    stream_event,
)
from lmedge.errors import BadRequest, PeerUnavailable
from lmedge.tokens import BearerToken

__all__ = ["HttpClients", "PeerUnavailable"]

#: Retries of a request whose connection failed or was closed before an answer.
_RETRIES = 2
#: Connections per httpx pool shard (see `_ShardedClient`).
_SHARD = 16
#: Wait before retry n is n x this, seconds.
_BACKOFF_S = 0.05
_RETRYABLE = (
    httpx.ConnectError,
    httpx.ConnectTimeout,
    httpx.ReadError,
    httpx.WriteError,
    httpx.RemoteProtocolError,
)


class _ShardedClient:
    """Several small httpx pools behind one semaphore, the least busy chosen per call.

    httpcore checks every pooled connection (a readability syscall each) on
    every request and rescans its wait queue on every change, so one pool of
    hundreds of connections costs milliseconds of CPU per request. Shards of
    `_SHARD` connections keep that scan short; the semaphore (which callers
    wait on instead of httpcore's queue) guarantees the least busy shard has
    a free connection.
    """

    def __init__(self, total: int, make: Callable[[httpx.Limits], httpx.AsyncClient]) -> None:
        shards = max(1, -(-total // _SHARD))
        per_shard = min(total, _SHARD)
        # Idle connections are dropped after 4 s, before uvicorn's default 5 s
        # keep-alive timeout closes them under a request in flight.
        limits = httpx.Limits(
            max_connections=per_shard, max_keepalive_connections=per_shard, keepalive_expiry=4.0
        )
        self._clients = [make(limits) for _ in range(shards)]
        self._busy = [0] * shards
        self._total = shards * per_shard
        self._slots: asyncio.Semaphore | None = None

    @asynccontextmanager
    async def client(self) -> AsyncIterator[httpx.AsyncClient]:
        """A client with a free connection (waits while all are busy)."""
        if self._slots is None:  # created in the running loop
            self._slots = asyncio.Semaphore(self._total)
        async with self._slots:
            index = min(range(len(self._busy)), key=self._busy.__getitem__)
            self._busy[index] += 1
            try:
                yield self._clients[index]
            finally:
                self._busy[index] -= 1

    async def aclose(self) -> None:
        for client in self._clients:
            await client.aclose()


class HttpClients:
    """Pooled clients to peer gateways and local model pods.

    `token` is sent as a bearer token to peer gateways (their control
    credential): a token, or a file holding one, re-read when the kubelet
    rotates it (`BearerToken`).
    `max_connections` bounds each of the two pools (default 512); requests
    beyond it wait their turn. `connect_timeout_s` (default 3 s) fails fast on
    a dead node; read timeouts come per call from the request's deadline. The
    transports are for in-process tests.
    """

    def __init__(
        self,
        *,
        token: str | Path | None = None,
        max_connections: int = 512,
        connect_timeout_s: float = 3.0,
        peer_transport: httpx.AsyncBaseTransport | None = None,
        model_transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        timeout = httpx.Timeout(None, connect=connect_timeout_s, pool=None)
        auth = BearerToken(token) if token else None
        # One TLS context for every shard: each client building its own loads the CA
        # bundle again (~30 ms each, seconds for a gateway's 64 clients at start).
        tls = httpx.create_ssl_context()
        self._connect_timeout_s = connect_timeout_s
        self._peers = _ShardedClient(
            max_connections,
            lambda limits: httpx.AsyncClient(
                limits=limits, timeout=timeout, auth=auth, transport=peer_transport, verify=tls
            ),
        )
        self._models = _ShardedClient(
            max_connections,
            lambda limits: httpx.AsyncClient(
                limits=limits, timeout=timeout, transport=model_transport, verify=tls
            ),
        )

    def _timeout(self, total_s: float) -> httpx.Timeout:
        return httpx.Timeout(total_s, connect=min(self._connect_timeout_s, total_s), pool=None)

    async def forward(
        self, base_url: str, request: ForwardRequest, timeout_s: float
    ) -> ForwardResult:
        """Hand a prompt set to the destination's gateway and wait for its result."""
        url = base_url.rstrip("/") + "/internal/forward"
        try:
            response = await self._post(self._peers, url, request, timeout_s)
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
        try:
            response = await self._post(self._models, target, request, timeout_s)
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

    async def stream_pod(
        self, url: str, protocol: PodStreamProtocol, call: EngineCall, timeout_s: float
    ) -> AsyncGenerator[Piece | Finish, None]:
        """Stream one prompt from a model pod: its pieces, then its `Finish`.

        Before the first byte: an unreachable or not-ready pod raises
        `ModelUnavailable` (the caller may retry), a pod refusing the input
        (4xx: a prompt too long for its context) `BadRequest` with the pod's
        reason, another status `ModelFailed`. After it: a broken connection or
        a malformed stream raises `ModelFailed`.
        """
        path, body = protocol.request(call)
        target = url.rstrip("/") + path
        async with self._models.client() as client:
            for attempt in range(_RETRIES + 1):
                opened = False
                try:
                    async with client.stream(
                        "POST", target, json=body, timeout=self._timeout(timeout_s)
                    ) as response:
                        opened = True
                        if response.status_code in (502, 503, 504):
                            raise ModelUnavailable(
                                f"model server at {url} not ready ({response.status_code})"
                            )
                        if response.status_code != 200:
                            reason = _reason((await response.aread()).decode(errors="replace"))
                            if 400 <= response.status_code < 500:
                                raise BadRequest(f"the model refused the request: {reason}")
                            raise ModelFailed(f"{response.status_code}: {reason}")
                        reader = protocol.reader()
                        decoder = SseDecoder()
                        try:
                            async for line in response.aiter_lines():
                                event = decoder.line(line)
                                piece = reader.event(event) if event is not None else None
                                if piece is not None:
                                    yield piece
                            last = decoder.end()
                            if last is not None:
                                reader.event(last)
                        except httpx.HTTPError as exc:
                            raise ModelFailed(
                                f"stream from the model server at {url} broke: {_describe(exc)}"
                            ) from exc
                        yield reader.finish()
                        return
                except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                    raise ModelUnavailable(f"model server at {url}: {_describe(exc)}") from exc
                except _RETRYABLE as exc:
                    # A pooled keep-alive connection the server closed as the request
                    # was written on it: no response, so nothing reached the client and
                    # the request is sent again on a fresh connection (as `_post`).
                    if opened or attempt == _RETRIES:
                        raise ModelFailed(f"model server at {url}: {_describe(exc)}") from exc
                    await asyncio.sleep(_BACKOFF_S * (attempt + 1))
                except httpx.HTTPError as exc:
                    raise ModelFailed(f"model server at {url}: {_describe(exc)}") from exc

    async def forward_stream(
        self, base_url: str, request: StreamForward, timeout_s: float
    ) -> AsyncGenerator[StreamStart | StreamText | StreamEnd, None]:
        """Hand a streamed prompt to the destination's gateway and yield its events.

        Ends with the destination's `StreamEnd`; `PeerUnavailable` when the
        peer cannot be reached, refuses, breaks off or sends a malformed event.
        """
        target = base_url.rstrip("/") + "/internal/stream"
        async with self._peers.client() as client:
            try:
                async with client.stream(
                    "POST",
                    target,
                    content=request.model_dump_json(),
                    headers={"Content-Type": "application/json"},
                    timeout=self._timeout(timeout_s),
                ) as response:
                    if response.status_code != 200:
                        text = (await response.aread()).decode(errors="replace")
                        raise PeerUnavailable(
                            f"gateway at {base_url} answered {response.status_code}: {text[:200]}"
                        )
                    decoder = SseDecoder()
                    async for line in response.aiter_lines():
                        event = decoder.line(line)
                        if event is None:
                            continue
                        try:
                            parsed = stream_event(event.data)
                        except ValueError as exc:  # pydantic's ValidationError included
                            raise PeerUnavailable(
                                f"gateway at {base_url} sent a malformed stream event"
                            ) from exc
                        yield parsed
                        if isinstance(parsed, StreamEnd):
                            return
            except (httpx.HTTPError, MalformedStream) as exc:
                raise PeerUnavailable(
                    f"stream from the gateway at {base_url} broke: {_describe(exc)}"
                ) from exc
        raise PeerUnavailable(f"gateway at {base_url} ended the stream before its end event")

    async def _post(
        self,
        pool: _ShardedClient,
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
        async with asyncio.timeout(timeout_s), pool.client() as client:
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


def _reason(text: str) -> str:
    """The message of an error body: OpenAI's `error.message`, FastAPI's `detail`, or the text."""
    try:
        body: Any = json.loads(text)
    except ValueError:
        return text[:200]
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])[:500]
        if isinstance(body.get("detail"), str):
            return str(body["detail"])[:500]
    return text[:200]


def _describe(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
