"""OpenAI-compatible request and response shapes, and their mapping to prompt sets.

Only what the four LM kinds need: chat completions (text, and image-to-text
through `image_url` content parts carrying `data:` URLs), legacy completions,
image generations (`b64_json`), and the model list. A request becomes one
prompt set: `n` copies of the chat prompt, each element of a completions
prompt list, or `n` images. Remote image URLs are refused with a clear 400:
the gateway never fetches from the internet on a user's behalf. Request models
ignore fields they do not use (temperature, user, ...) so the official SDK
works unchanged; `stream_options` is checked strictly (an unknown option is a
422 naming it).

Streaming (`stream: true`, chat and completions): one prompt per request (`n`
> 1, or a list of several prompts, is a 400), answered as OpenAI chunks
(`ChunkWriter`): for chat a first chunk with the assistant role, then one
chunk per piece of text, a last chunk with `finish_reason`, with
`stream_options.include_usage` one more chunk with no choices and the usage,
then `data: [DONE]`. A failure after the stream began is one `{"error": ...}`
event (what the OpenAI SDK raises as an `APIError`) before `[DONE]`.
"""

from __future__ import annotations

import base64
import binascii
import re
import time
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, field_validator

from lmedge.api.inference import MAX_IMAGE_CHARS, MAX_PROMPT_CHARS, MAX_PROMPTS, Output, Prompt
from lmedge.api.resources import Modality
from lmedge.errors import BadRequest

__all__ = [
    "BadRequest",
    "ChatCompletionRequest",
    "ChunkWriter",
    "CompletionRequest",
    "ImageGenerationRequest",
    "chat_prompts",
    "chat_response",
    "completion_prompts",
    "completion_response",
    "image_prompts",
    "image_response",
    "model_list",
    "stream_error",
    "stream_prompt",
    "usage",
]

_DATA_URL = re.compile(r"^data:image/(png|jpeg|jpg|webp|gif);base64,(?P<data>[A-Za-z0-9+/=\s]+)$")


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore")


class TextPart(_Lenient):
    type: Literal["text"]
    text: str = Field(max_length=MAX_PROMPT_CHARS)


class ImageURL(_Lenient):
    url: str = Field(max_length=12 * 1024 * 1024)

    @field_validator("url")
    @classmethod
    def _image_fits(cls, url: str) -> str:
        # The native endpoint's bound (`Prompt.image`), checked here so an oversized
        # image is the same 422 on both endpoints, not a 500 when the prompt is built.
        _, comma, data = url.partition(",")
        if comma and url.startswith("data:") and len(data) > MAX_IMAGE_CHARS:
            size = len(re.sub(r"\s+", "", data))
            if size > MAX_IMAGE_CHARS:
                raise ValueError(
                    f"the image is {size} base64 characters; at most {MAX_IMAGE_CHARS}"
                )
        return url


class ImagePart(_Lenient):
    type: Literal["image_url"]
    image_url: ImageURL


ContentPart = Annotated[TextPart | ImagePart, Field(discriminator="type")]


class StreamOptions(BaseModel):
    """`stream_options`: only `include_usage`; anything else is refused by name."""

    model_config = ConfigDict(extra="forbid")

    include_usage: bool = False


def _content_kind(value: Any) -> str:
    return "parts" if isinstance(value, list) else "text"


#: A message's content: a string (`text`) or a list of parts (`parts`). Chosen by
#: the value's JSON type, so an error names the branch that was sent (a bad image
#: part is `content.parts.0...`, not "content: Input should be a valid string").
MessageContent = Annotated[
    Annotated[str, Tag("text")] | Annotated[list[ContentPart], Tag("parts")],
    Discriminator(_content_kind),
]


class ChatMessage(_Lenient):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: MessageContent | None = None


class ChatCompletionRequest(_Lenient):
    model: str = Field(min_length=1, max_length=63)
    messages: list[ChatMessage] = Field(min_length=1, max_length=256)
    max_tokens: int | None = Field(default=None, ge=1, le=4096)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=4096)
    n: int = Field(default=1, ge=1, le=MAX_PROMPTS)
    stream: bool | None = False
    stream_options: StreamOptions | None = None


class CompletionRequest(_Lenient):
    model: str = Field(min_length=1, max_length=63)
    # No bound here: on the union, the list's 64-item bound also capped a string
    # prompt at 64 characters, and an error on a union names the wrong branch.
    # completion_prompts checks the item count and each text's length.
    prompt: str | list[str]
    max_tokens: int | None = Field(default=None, ge=1, le=4096)
    stream: bool | None = False
    stream_options: StreamOptions | None = None


class ImageGenerationRequest(_Lenient):
    model: str = Field(min_length=1, max_length=63)
    prompt: str = Field(min_length=1, max_length=MAX_PROMPT_CHARS)
    n: int = Field(default=1, ge=1, le=MAX_PROMPTS)
    response_format: Literal["b64_json", "url"] | None = "b64_json"
    size: str | None = None


def _stream_options(req: ChatCompletionRequest | CompletionRequest) -> None:
    if req.stream_options is not None and not req.stream:
        raise BadRequest("stream_options is only allowed when stream is true")


def _image_data(url: str) -> str:
    match = _DATA_URL.match(url)
    if match is None:
        raise BadRequest(
            "image_url must be a data: URL with a base64 PNG/JPEG/WebP/GIF image; "
            "the gateway does not fetch remote images"
        )
    data = re.sub(r"\s+", "", match.group("data"))
    if not data:
        raise BadRequest("image_url data is empty (whitespace only); send a base64 image")
    try:
        base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise BadRequest("image_url data is not valid base64") from exc
    return data


def chat_prompts(req: ChatCompletionRequest, modality: Modality) -> list[Prompt]:
    """The prompt set of a chat request: message texts joined, at most one image."""
    _stream_options(req)
    if modality not in ("text-to-text", "image-to-text"):
        raise BadRequest(f"{req.model} is a {modality} service; use the matching endpoint")
    texts: list[str] = []
    images: list[str] = []
    for message in req.messages:
        if isinstance(message.content, str):
            texts.append(message.content)
        elif message.content is not None:
            for part in message.content:
                if isinstance(part, TextPart):
                    texts.append(part.text)
                else:
                    images.append(_image_data(part.image_url.url))
    if modality == "text-to-text" and images:
        raise BadRequest(f"{req.model} is a text-to-text service and takes no images")
    if modality == "image-to-text" and len(images) != 1:
        raise BadRequest(
            f"{req.model} is an image-to-text service: send exactly one image_url part"
        )
    text = "\n".join(t for t in texts if t)
    if len(text) > MAX_PROMPT_CHARS:
        raise BadRequest(f"the messages add up to more than {MAX_PROMPT_CHARS} characters")
    if not text and not images:
        raise BadRequest("the messages contain no text")
    limit = req.max_completion_tokens or req.max_tokens
    prompt = Prompt(text=text, image=images[0] if images else None, max_tokens=limit)
    return [prompt] * req.n


def completion_prompts(req: CompletionRequest, modality: Modality) -> list[Prompt]:
    _stream_options(req)
    if modality != "text-to-text":
        raise BadRequest(f"{req.model} is a {modality} service; completions need text-to-text")
    texts = [req.prompt] if isinstance(req.prompt, str) else list(req.prompt)
    if not texts:
        raise BadRequest("prompt must not be an empty list")
    if len(texts) > MAX_PROMPTS:
        raise BadRequest(f"prompt lists {len(texts)} prompts; at most {MAX_PROMPTS} per request")
    for text in texts:
        if len(text) > MAX_PROMPT_CHARS:
            raise BadRequest(f"a prompt is longer than {MAX_PROMPT_CHARS} characters")
    return [Prompt(text=t, max_tokens=req.max_tokens) for t in texts]


def image_prompts(req: ImageGenerationRequest, modality: Modality) -> list[Prompt]:
    if modality != "text-to-image":
        raise BadRequest(
            f"{req.model} is a {modality} service; image generation needs text-to-image"
        )
    if req.response_format == "url":
        raise BadRequest("response_format url is not supported; use b64_json")
    return [Prompt(text=req.prompt)] * req.n


def usage(outputs: list[Output]) -> dict[str, int] | None:
    """OpenAI `usage` from the model server's counts: the sum over every prompt run.

    A chat request with `n` > 1 runs its prompt `n` times, and each run is
    counted. None (JSON null) when any output lacks a count: a partial sum
    would under-report.
    """
    if not outputs or any(o.prompt_tokens is None or o.completion_tokens is None for o in outputs):
        return None
    prompt = sum(o.prompt_tokens or 0 for o in outputs)
    completion = sum(o.completion_tokens or 0 for o in outputs)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def chat_response(rid: str, model: str, outputs: list[Output]) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-{rid}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": i,
                "message": {"role": "assistant", "content": out.text or ""},
                "finish_reason": "stop",
                "logprobs": None,
            }
            for i, out in enumerate(outputs)
        ],
        "usage": usage(outputs),
    }


def completion_response(rid: str, model: str, outputs: list[Output]) -> dict[str, Any]:
    return {
        "id": f"cmpl-{rid}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {"index": i, "text": out.text or "", "finish_reason": "stop", "logprobs": None}
            for i, out in enumerate(outputs)
        ],
        "usage": usage(outputs),
    }


def image_response(outputs: list[Output]) -> dict[str, Any]:
    return {
        "created": int(time.time()),
        "data": [{"b64_json": out.image or ""} for out in outputs],
    }


def model_list(services: dict[str, Modality]) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [
            {"id": name, "object": "model", "created": 0, "owned_by": "lmedge", "modality": kind}
            for name, kind in sorted(services.items())
        ],
    }


def stream_prompt(
    req: ChatCompletionRequest | CompletionRequest, modality: Modality
) -> tuple[Prompt, list[dict[str, Any]] | None]:
    """The one prompt of a streamed request, and a chat's messages as sent (for an
    engine that applies its own chat template); None for a completion."""
    if isinstance(req, ChatCompletionRequest):
        if req.n != 1:
            raise BadRequest(
                f"n must be 1 when stream is true (got {req.n}): one stream, one choice"
            )
        prompts = chat_prompts(req, modality)
        messages = [m.model_dump(mode="json", exclude_none=True) for m in req.messages]
        return prompts[0], messages
    prompts = completion_prompts(req, modality)
    if len(prompts) != 1:
        raise BadRequest(
            f"prompt lists {len(prompts)} prompts; a streamed completion takes exactly one"
        )
    return prompts[0], None


class ChunkWriter:
    """The OpenAI chunks of one streamed answer (chat or completion), as dicts."""

    def __init__(self, kind: Literal["chat", "completion"], rid: str, model: str) -> None:
        self.kind = kind
        self.id = f"chatcmpl-{rid}" if kind == "chat" else f"cmpl-{rid}"
        self.model = model
        self.created = int(time.time())

    def _chunk(self, choices: list[dict[str, Any]], **more: Any) -> dict[str, Any]:
        kind = "chat.completion.chunk" if self.kind == "chat" else "text_completion"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model,
                "choices": choices, **more}  # fmt: skip

    def _choice(
        self, text: str | None, finish_reason: str | None, role: bool = False
    ) -> dict[str, Any]:
        if self.kind == "completion":
            return {
                "index": 0,
                "text": text or "",
                "finish_reason": finish_reason,
                "logprobs": None,
            }
        delta: dict[str, Any] = {"role": "assistant"} if role else {}
        if text is not None:
            delta["content"] = text
        return {"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}

    def start(self) -> list[dict[str, Any]]:
        """What goes before the first piece: the assistant role, for chat."""
        return [self._chunk([self._choice("", None, role=True)])] if self.kind == "chat" else []

    def text(self, text: str) -> dict[str, Any]:
        return self._chunk([self._choice(text, None)])

    def end(
        self, finish_reason: str, usage: dict[str, int] | None, include_usage: bool
    ) -> list[dict[str, Any]]:
        """The last chunk, and with `include_usage` the usage chunk (no choices)."""
        last = self._chunk([self._choice(None if self.kind == "chat" else "", finish_reason)])
        return [last, self._chunk([], usage=usage)] if include_usage else [last]


def stream_error(message: str, kind: str, code: str | None = None) -> dict[str, Any]:
    """The event that ends a stream that failed after it began."""
    return {"error": {"message": message, "type": kind, "code": code}}
