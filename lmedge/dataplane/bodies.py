"""What a request body must be before the gateway parses it: small, JSON, valid text.

`BodyGuard` is ASGI middleware in front of every POST/PUT/PATCH:

* 413 when the body is larger than the limit, whether `Content-Length` says
  so or a chunked body grows past it (it is read here, up to the limit, so the
  framework never sees the oversized rest and cannot turn it into a 400);
* 415 when the body is not `application/json`;
* 400 when the JSON escapes a lone UTF-16 surrogate (`"\\ud800"`): Python
  decodes it into a `str` that no UTF-8 encoder accepts, so it would fail
  later, as a 500, wherever the text is forwarded, stored or logged. Paired
  surrogates (`"\\ud83d\\ude00"`, how `json.dumps` escapes an emoji) are fine.

* 400 when the JSON holds `NaN`, `Infinity` or `-Infinity`: not JSON
  (RFC 8259), yet Python's parser takes them, and an infinite budget or slot
  length would pass every `> 0` bound.

It does not validate the JSON's shape; the endpoints' models do, and invalid
JSON is answered 400 by the app's error handler, as OpenAI does.
"""

from __future__ import annotations

import json
import re
from typing import Any

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["BodyGuard", "error_response", "lone_surrogate", "non_finite"]

#: A `\uD800`-`\uDFFF` escape: cheap to look for in the raw bytes; only a body
#: containing one is decoded to check that every surrogate is paired.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def error_response(status: int, message: str, kind: str, code: str | None = None) -> JSONResponse:
    """An error in the OpenAI shape `{"error": {"message", "type", "code"}}`."""
    return JSONResponse(
        {"error": {"message": message, "type": kind, "code": code}}, status_code=status
    )


#: Bytes that may start a non-finite constant; only a body holding one is parsed here.
_CONSTANT = re.compile(rb"NaN|Infinity")


class _Constant(ValueError):
    pass


def _refuse(name: str) -> Any:
    raise _Constant(name)


def non_finite(body: bytes) -> str | None:
    """The first `NaN`/`Infinity`/`-Infinity` the JSON `body` holds as a number, or None."""
    if _CONSTANT.search(body) is None:
        return None
    try:
        json.loads(body, parse_constant=_refuse)
    except _Constant as exc:
        return str(exc)
    except ValueError:
        return None  # not JSON at all: the app answers that
    return None


def lone_surrogate(body: bytes) -> bool:
    """True when the JSON `body` holds a string with an unpaired UTF-16 surrogate.

    A body that is not JSON is not this check's business (False): the app
    answers it as invalid JSON.
    """
    if _SURROGATE_ESCAPE.search(body) is None:
        return False
    try:
        value = json.loads(body)
    except ValueError:
        return False
    try:
        # Lone surrogates are the only strings json.loads makes that UTF-8 refuses.
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


class BodyGuard:
    """Rejects oversized (413), non-JSON (415), unencodable and non-finite (400) bodies."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    def _too_large(self) -> JSONResponse:
        return error_response(
            413, f"request body larger than {self.max_bytes} bytes", "invalid_request_error"
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in ("POST", "PUT", "PATCH"):
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        length = headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_bytes):
            await self._too_large()(scope, receive, send)
            return
        ctype = headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if ctype != "application/json":
            await error_response(
                415,
                "request body must be JSON (Content-Type: application/json)",
                "invalid_request_error",
            )(scope, receive, send)
            return
        chunks: list[bytes] = []
        seen = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away before the body was complete
            chunk = message.get("body", b"")
            seen += len(chunk)
            if seen > self.max_bytes:
                await self._too_large()(scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        if lone_surrogate(body):
            await error_response(
                400,
                "request body holds a lone UTF-16 surrogate (\\ud800-\\udfff escape "
                "without its pair); send valid Unicode text",
                "invalid_request_error",
            )(scope, receive, send)
            return
        constant = non_finite(body)
        if constant is not None:
            await error_response(
                400,
                f"request body holds {constant}, which is not a JSON number",
                "invalid_request_error",
            )(scope, receive, send)
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: wait for the disconnect

        await self.app(scope, replay, send)
