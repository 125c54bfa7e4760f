"""The gateway's HTTP surface (FastAPI): parse, authorise, call `Gateway`, render.

Endpoints:

* users: `POST /v1/prompt-sets` (native), `POST /v1/chat/completions`,
  `POST /v1/completions`, `POST /v1/images/generations`, `GET /v1/models`;
* controller and node agent: `PUT /control/routing` (the slot's routing map,
  pushed each slot as in the paper's FastAPI broadcast), `PUT /control/models`
  (the model pods serving here), `GET /control/status`;
* peer gateways: `POST /internal/forward`, `POST /internal/stream` (a
  streamed prompt: the destination's `StreamStart` / `StreamText` /
  `StreamEnd` events as server-sent events);
* operations: `GET /metrics` (Prometheus), `GET /healthz`, `GET /readyz`.

Why push and not poll: the routing map is decided once per slot and must be in
force for every request of that slot; a push lands it within one round trip
and needs no store access on the request path. A gateway that misses a push
keeps the previous map, and with no map at all it serves locally (the paper's
fallback).

User endpoints take the API token, control and internal endpoints the
control credential (`lmedge.dataplane.auth`: never the user token); with
neither set every endpoint is open (development only). Bodies are limited in
size and must be JSON; errors come back in the OpenAI shape
`{"error": {"message", "type", "code"}}` so the OpenAI SDK shows them. A set
the slot's map refuses (admission control) is answered 429 at once, code
`rejected`, with `Retry-After` = seconds left in the map's slot.

Streams (`stream: true` on chat and completions): the request is validated
and admitted first (errors and the 429 as above, before any SSE), then the
handler waits for the first piece (queue and prefill), still able to answer
a plain error (400 for an input the engine refused, 502 / 504 as for a set)
and watching for the client leaving; from the first piece on, the answer is
`text/event-stream` in the OpenAI chunk format (`lmedge.dataplane.openai`)
and a failure is a final error event. A client that disconnects at any point
closes the stream, which cancels it upstream and records it `cancelled`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Literal

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from lmedge.dataplane import openai as oa
from lmedge.dataplane.auth import (
    ControlAuth,
    StaticTokenAuth,
    check_credentials,
    control_guard,
    user_guard,
)
from lmedge.dataplane.bodies import BodyGuard
from lmedge.dataplane.gateway import (
    DuplicateRequestId,
    Gateway,
    OpenedStream,
    Rejected,
    UnknownLM,
)
from lmedge.dataplane.sse import format_event
from lmedge.dataplane.wire import (
    ForwardRequest,
    ForwardResult,
    GatewayStatus,
    LocalModels,
    PromptSetRequest,
    PromptSetResult,
    RoutingUpdate,
    StreamEnd,
    StreamForward,
    StreamText,
)
from lmedge.errors import UserError

__all__ = ["ApiSettings", "create_app"]

log = logging.getLogger(__name__)

#: Default largest request body, bytes: 64 prompts of text, or a few images.
DEFAULT_MAX_BODY = 32 * 1024 * 1024


@dataclass(frozen=True)
class ApiSettings:
    """HTTP-level settings: tokens and the body limit (bytes)."""

    token: str | None = None
    control_token: str | None = None
    #: Who may call /control/* and /internal/forward; `control_token` is the
    #: shorthand for a `StaticTokenAuth`.
    control_auth: ControlAuth | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY

    def __post_init__(self) -> None:
        check_credentials(self.token, self.control)

    @property
    def control(self) -> ControlAuth | None:
        """The control credential's check (None: the control API is open)."""
        if self.control_auth is not None:
            return self.control_auth
        return StaticTokenAuth(self.control_token) if self.control_token is not None else None


def _error(status: int, message: str, kind: str, code: str | None = None) -> JSONResponse:
    return JSONResponse(
        {"error": {"message": message, "type": kind, "code": code}}, status_code=status
    )


def create_app(gateway: Gateway, api: ApiSettings | None = None) -> FastAPI:
    """The gateway's ASGI app; closes the gateway (queues, clients, sink) on shutdown."""
    api = api or ApiSettings()
    if api.token is None:
        log.warning(
            "gateway of %s has no user token: /v1/* is open to every caller "
            "(development only; give --token-file)",
            gateway.node,
        )
    closers: list[Callable[[], Awaitable[None]]] = [gateway.close]

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        for close in closers:
            await close()

    app = FastAPI(
        title="lmedge gateway",
        version="0.1.0",
        summary=f"Node gateway of {gateway.node}: prompt sets, OpenAI-compatible API, control.",
        lifespan=lifespan,
    )
    app.state.gateway = gateway
    app.state.closers = closers
    app.add_middleware(BodyGuard, max_bytes=api.max_body_bytes)
    user = [Depends(user_guard(api.token))]
    control = [Depends(control_guard(api.control, "control"))]
    peers = [Depends(control_guard(api.control, "forward"))]
    _errors(app)

    @app.get("/healthz", tags=["ops"])
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", tags=["ops"])
    async def readyz() -> dict[str, str]:
        return {"status": "ready", "node": gateway.node}

    @app.get("/metrics", tags=["ops"], response_class=Response)
    async def metrics() -> Response:
        return Response(gateway.metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models", tags=["openai"], dependencies=user)
    async def models() -> dict[str, Any]:
        return oa.model_list(gateway.settings.names())  # LMs and request classes

    @app.post("/v1/prompt-sets", tags=["native"], dependencies=user)
    async def prompt_sets(body: PromptSetRequest) -> PromptSetResult:
        return await gateway.submit(body.lm, body.prompts, body.id)

    async def stream(
        kind: Literal["chat", "completion"],
        body: oa.ChatCompletionRequest | oa.CompletionRequest,
        request: Request,
    ) -> Response:
        prompt, messages = oa.stream_prompt(body, gateway.check_lm(body.model))
        opened = await gateway.open_stream(body.model, prompt, messages)  # Rejected: the 429
        first = await _first(opened, request)
        if first is None:  # the client left before the first piece
            return Response(status_code=499)
        headers = _stream_headers(opened)
        if isinstance(first, StreamEnd) and first.outcome != "success":
            response = _stream_failed(opened.id, first)
            response.headers.update(headers)
            return response
        include = bool(body.stream_options and body.stream_options.include_usage)
        writer = oa.ChunkWriter(kind, opened.id, opened.model)
        return StreamingResponse(
            _chunks(writer, first, opened, include),
            media_type="text/event-stream",
            headers={**headers, "Cache-Control": "no-cache"},
        )

    @app.post("/v1/chat/completions", tags=["openai"], dependencies=user)
    async def chat(body: oa.ChatCompletionRequest, request: Request) -> Response:
        if body.stream:
            return await stream("chat", body, request)
        prompts = oa.chat_prompts(body, gateway.check_lm(body.model))
        result = await gateway.submit(body.model, prompts)
        return _served(result) or JSONResponse(
            oa.chat_response(result.id, _model(result), result.outputs), headers=_headers(result)
        )

    @app.post("/v1/completions", tags=["openai"], dependencies=user)
    async def completions(body: oa.CompletionRequest, request: Request) -> Response:
        if body.stream:
            return await stream("completion", body, request)
        prompts = oa.completion_prompts(body, gateway.check_lm(body.model))
        result = await gateway.submit(body.model, prompts)
        return _served(result) or JSONResponse(
            oa.completion_response(result.id, _model(result), result.outputs),
            headers=_headers(result),
        )

    @app.post("/v1/images/generations", tags=["openai"], dependencies=user)
    async def images(body: oa.ImageGenerationRequest) -> JSONResponse:
        prompts = oa.image_prompts(body, gateway.check_lm(body.model))
        result = await gateway.submit(body.model, prompts)
        return _served(result) or JSONResponse(
            oa.image_response(result.outputs), headers=_headers(result)
        )

    @app.put("/control/routing", tags=["control"], dependencies=control)
    async def put_routing(body: RoutingUpdate) -> dict[str, int]:
        return {"routes": gateway.set_routing(body), "slot": body.slot}

    @app.put("/control/models", tags=["control"], dependencies=control)
    async def put_models(body: LocalModels) -> dict[str, list[str]]:
        return {"active": gateway.set_models(body)}

    @app.get("/control/status", tags=["control"], dependencies=control)
    async def status() -> GatewayStatus:
        return gateway.status()

    @app.post("/internal/forward", tags=["internal"], dependencies=peers)
    async def forward(body: ForwardRequest) -> ForwardResult:
        return await gateway.accept(body)

    @app.post("/internal/stream", tags=["internal"], dependencies=peers)
    async def forward_stream(body: StreamForward) -> StreamingResponse:
        gateway.check_stream(body)
        return StreamingResponse(_events(gateway, body), media_type="text/event-stream")

    return app


async def _first(opened: OpenedStream, request: Request) -> StreamText | StreamEnd | None:
    """The stream's first piece (or its end), or None when the client leaves first.

    Until the first piece nothing is sent, so uvicorn would not notice a client
    that left while the stream waits in a queue; this watches for it, and
    cancels the stream (which frees its place) when it happens.
    """
    first = asyncio.ensure_future(anext(opened.events))
    gone = asyncio.ensure_future(_disconnect(request))
    try:
        await asyncio.wait({first, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if first.done():
        return first.result()
    first.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await first
    await opened.events.aclose()
    return None


async def _disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _chunks(
    writer: oa.ChunkWriter, first: StreamText | StreamEnd, opened: OpenedStream, include: bool
) -> AsyncGenerator[bytes, None]:
    """The OpenAI chunks of a stream that has begun, ending with `[DONE]`."""
    try:
        # The opening chunks and the first text go out as one write: each write is a
        # send on the socket, and the first token is what the client is waiting for.
        head = b"".join(_data(chunk) for chunk in writer.start())
        event: StreamText | StreamEnd = first
        if isinstance(first, StreamText):
            yield head + _data(writer.text(first.text))
            event = await anext(opened.events)
        else:
            yield head
        while isinstance(event, StreamText):
            yield _data(writer.text(event.text))
            event = await anext(opened.events)
        if event.outcome == "success":
            usage = None
            if event.completion_tokens is not None and event.prompt_tokens is not None:
                usage = {
                    "prompt_tokens": event.prompt_tokens,
                    "completion_tokens": event.completion_tokens,
                    "total_tokens": event.prompt_tokens + event.completion_tokens,
                }
            for chunk in writer.end(event.finish_reason or "stop", usage, include):
                yield _data(chunk)
        else:
            why = event.error or f"missed its deadline at {event.destination}"
            kind = "timeout" if event.outcome == "timeout" and not event.error else "upstream_error"
            yield _data(oa.stream_error(f"request {opened.id} failed: {why}", kind, event.outcome))
        yield b"data: [DONE]\n\n"
    finally:
        await opened.events.aclose()  # the client left mid-stream: cancel upstream, record


def _data(chunk: dict[str, Any]) -> bytes:
    return format_event(json.dumps(chunk, separators=(",", ":")))


async def _events(gateway: Gateway, body: StreamForward) -> AsyncGenerator[bytes, None]:
    """A destination's stream events as SSE, for the origin gateway."""
    events = gateway.accept_stream(body)
    try:
        async for event in events:
            yield format_event(event.model_dump_json())
    finally:
        await events.aclose()


def _stream_headers(opened: OpenedStream) -> dict[str, str]:
    return {
        "x-lmedge-request-id": opened.id,
        "x-lmedge-destination": opened.destination,
        "x-lmedge-model": opened.model,
    }


def _stream_failed(rid: str, end: StreamEnd) -> JSONResponse:
    """The answer for a stream that ended before its first piece (nothing sent yet)."""
    if end.invalid:
        return _error(400, end.error or "the model refused the request", "invalid_request_error")
    if end.outcome == "timeout" and not end.error:
        return _error(504, f"request {rid} missed its deadline at {end.destination}", "timeout")
    return _error(502, f"request {rid} failed: {end.error}", "upstream_error", end.outcome)


def _model(result: PromptSetResult) -> str:
    """The response's `model`: the LM that served it, as OpenAI names the concrete model
    behind an alias (here: the LM the routing map chose for a request class)."""
    return result.model or result.lm


def _headers(result: PromptSetResult) -> dict[str, str]:
    return {
        "x-lmedge-request-id": result.id,
        "x-lmedge-destination": result.destination,
        "x-lmedge-model": _model(result),
    }


def _served(result: PromptSetResult) -> JSONResponse | None:
    """An error response for a set that was not served in full, else None."""
    if result.outcome == "success":
        return None
    if result.error:
        response = _error(502, f"request {result.id} failed: {result.error}", "upstream_error")
    else:
        response = _error(
            504, f"request {result.id} missed its deadline at {result.destination}", "timeout"
        )
    response.headers.update(_headers(result))
    return response


def _errors(app: FastAPI) -> None:
    @app.exception_handler(Rejected)
    async def rejected(_: Request, exc: Rejected) -> JSONResponse:
        # 429 + Retry-After: what HTTP clients (the OpenAI SDK among them) back off on
        response = _error(429, str(exc), "rate_limit_error", "rejected")
        response.headers.update(
            {"Retry-After": str(exc.retry_after_s), "x-lmedge-request-id": exc.request_id}
        )
        return response

    @app.exception_handler(UnknownLM)
    async def unknown_lm(_: Request, exc: UnknownLM) -> JSONResponse:
        return _error(404, str(exc), "invalid_request_error", "model_not_found")

    @app.exception_handler(DuplicateRequestId)
    async def duplicate_id(_: Request, exc: DuplicateRequestId) -> JSONResponse:
        return _error(409, str(exc), "invalid_request_error", "duplicate_request_id")

    @app.exception_handler(UserError)
    async def user_error(_: Request, exc: UserError) -> JSONResponse:
        return _error(400, str(exc), "invalid_request_error")

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        if first.get("type") == "json_invalid":
            # Not JSON at all: a malformed request (400, as OpenAI answers), not a
            # well-formed one with wrong content (422).
            ctx = first.get("ctx") or {}
            detail = ctx.get("error", first.get("msg")) if isinstance(ctx, dict) else ctx
            return _error(400, f"request body is not valid JSON: {detail}", "invalid_request_error")
        # A field OpenAI does not document: its 400, whatever else is wrong (it
        # checks the argument names first).
        unknown = [e for e in exc.errors() if e.get("type") == oa.UNRECOGNIZED]
        first = unknown[0] if unknown else first
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        more = len(exc.errors()) - 1
        message = f"{where}: {first.get('msg')}" if where else str(first.get("msg"))
        if unknown:
            return _error(400, message, "invalid_request_error")
        return _error(
            422, message + (f" (and {more} more)" if more > 0 else ""), "invalid_request_error"
        )

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if exc.status_code == 401 else None
        response = _error(exc.status_code, str(exc.detail), "invalid_request_error")
        if headers:
            response.headers.update(headers)
        return response
