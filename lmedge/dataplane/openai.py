"""OpenAI-compatible request and response shapes, and their mapping to prompt sets.

Only what the four LM kinds need: chat completions (text, and image-to-text
through `image_url` content parts carrying `data:` URLs), legacy completions,
image generations (`b64_json`), and the model list. A request becomes one
prompt set: `n` copies of the chat prompt, each element of a completions
prompt list, or `n` images. Remote image URLs are refused with a clear 400:
the gateway never fetches from the internet on a user's behalf.

Chat completions and completions know every parameter OpenAI documents for
them, and refuse any other top-level field (or message field) with a 400
naming it, as OpenAI does (`Unrecognized request argument supplied: NAME`):
a misspelt `temprature` is an error, not a silent default. Of the known ones:

* the sampling parameters (temperature, top_p, seed, stop, presence and
  frequency penalty; OpenAI's ranges, `lmedge.api.inference.Sampling`) and
  the token bound go with each prompt to the engine;
* advisory ones are accepted and have no effect on the output: `user`,
  `safety_identifier`, `prompt_cache_key`, `prompt_cache_retention`,
  `metadata`, `store`, `service_tier`, `parallel_tool_calls`, `prediction`
  (a latency hint);
* what the engines cannot honour is a 400 saying so when asked for, and
  accepted at its neutral value (`tools: []`, `tool_choice: "none"`,
  `logprobs: false`, `response_format: {"type": "text"}`, `modalities:
  ["text"]`, `best_of: 1`, `echo: false`, ...): tools and function calls,
  log probabilities, logit bias, JSON output formats, audio, reasoning and
  verbosity settings, web search, a completion's `suffix`, `echo` and
  `best_of`.

Image generations still ignore fields they do not use. `stream_options` is
checked strictly (an unknown option is a 422 naming it).

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
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from lmedge.api.inference import (
    MAX_IMAGE_CHARS,
    MAX_PROMPT_CHARS,
    MAX_PROMPTS,
    MAX_STOP,
    Output,
    Penalty,
    Prompt,
    Sampling,
    Seed,
    StopText,
    Temperature,
    TopP,
)
from lmedge.api.resources import Modality
from lmedge.errors import BadRequest

__all__ = [
    "UNRECOGNIZED",
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


#: The pydantic error type of a field the OpenAI API does not document: the
#: gateway answers it with a 400 (OpenAI's status), not a 422.
UNRECOGNIZED = "unrecognized_argument"


class _Strict(BaseModel):
    """An object that refuses, by name, every field it does not declare."""

    model_config = ConfigDict(extra="forbid")
    #: What one of its fields is called in the error ("request argument", ...).
    _what: ClassVar[str] = "request argument"

    @model_validator(mode="before")
    @classmethod
    def _known_fields(cls, data: Any) -> Any:
        if isinstance(data, dict):
            unknown = sorted(str(k) for k in data if k not in cls.model_fields)
            if unknown:
                raise PydanticCustomError(
                    UNRECOGNIZED,
                    "Unrecognized {what} supplied: {names}",
                    {"what": cls._what, "names": ", ".join(unknown)},
                )
        return data


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


class ChatMessage(_Strict):
    """A message as OpenAI documents it; tool calls (in or out) are refused as unsupported."""

    _what: ClassVar[str] = "message field"

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: MessageContent | None = None
    name: str | None = Field(default=None, max_length=256)
    refusal: str | None = Field(default=None, max_length=MAX_PROMPT_CHARS)
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    function_call: dict[str, Any] | None = None
    audio: dict[str, Any] | None = None


#: A stop sequence or up to four (OpenAI's `stop`).
Stop = StopText | Annotated[list[StopText], Field(max_length=MAX_STOP)]


class _Sampled(_Strict):
    """The parameters both endpoints share: the sampling ones, and those only accepted."""

    model: str = Field(min_length=1, max_length=63)
    max_tokens: int | None = Field(default=None, ge=1, le=4096)
    n: int = Field(default=1, ge=1, le=MAX_PROMPTS)
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    seed: Seed | None = None
    stop: Stop | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    logit_bias: dict[str, Annotated[float, Field(ge=-100, le=100)]] | None = None
    user: str | None = Field(default=None, max_length=256)

    def sampling(self) -> Sampling | None:
        """The sampling parameters for the engine; None when none was given."""
        stop = [self.stop] if isinstance(self.stop, str) else self.stop
        sampling = Sampling(
            temperature=self.temperature,
            top_p=self.top_p,
            seed=self.seed,
            stop=stop or None,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
        )
        return sampling if sampling.model_dump(exclude_none=True) else None

    def _unsupported(self) -> list[str]:
        """What was asked for that the engines cannot do, as `field: why` lines."""
        out = []
        if self.logit_bias:
            out.append("logit_bias (token ids differ between engines)")
        return out


class ChatCompletionRequest(_Sampled):
    messages: list[ChatMessage] = Field(min_length=1, max_length=256)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=4096)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    response_format: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    functions: list[dict[str, Any]] | None = None
    function_call: str | dict[str, Any] | None = None
    modalities: list[str] | None = None
    audio: dict[str, Any] | None = None
    reasoning_effort: str | None = None
    verbosity: str | None = None
    web_search_options: dict[str, Any] | None = None
    prediction: dict[str, Any] | None = None
    metadata: dict[str, str] | None = Field(default=None, max_length=16)
    store: bool | None = None
    service_tier: str | None = None
    safety_identifier: str | None = Field(default=None, max_length=256)
    prompt_cache_key: str | None = Field(default=None, max_length=256)
    prompt_cache_retention: str | None = None

    def _unsupported(self) -> list[str]:
        out = super()._unsupported()
        if self.tools or self.functions:
            out.append("tools (the engines do not call tools)")
        if self.tool_choice not in (None, "none") or self.function_call not in (None, "none"):
            out.append("tool_choice (the engines do not call tools)")
        if self.logprobs or self.top_logprobs:
            out.append("logprobs")
        kind = (self.response_format or {}).get("type", "text")
        if kind != "text":
            out.append(f"response_format {kind!r} (only 'text')")
        if self.audio is not None or any(m != "text" for m in self.modalities or []):
            out.append("audio output (only the text modality)")
        for name in ("reasoning_effort", "verbosity", "web_search_options"):
            if getattr(self, name) is not None:
                out.append(name)
        for i, message in enumerate(self.messages):
            if message.tool_calls or message.tool_call_id is not None:
                out.append(f"messages.{i}: tool calls (the engines do not call tools)")
            if message.function_call is not None or message.audio is not None:
                out.append(f"messages.{i}: function_call and audio")
        return out


class CompletionRequest(_Sampled):
    # No bound here: on the union, the list's 64-item bound also capped a string
    # prompt at 64 characters, and an error on a union names the wrong branch.
    # completion_prompts checks the item count and each text's length.
    prompt: str | list[str]
    logprobs: int | None = Field(default=None, ge=0, le=5)
    suffix: str | None = None
    echo: bool | None = None
    best_of: int | None = Field(default=None, ge=1, le=20)

    def _unsupported(self) -> list[str]:
        out = super()._unsupported()
        if self.logprobs is not None:
            out.append("logprobs")
        if self.suffix:
            out.append("suffix (no fill-in-the-middle)")
        if self.echo:
            out.append("echo")
        if self.best_of is not None and self.best_of > 1:
            out.append("best_of > 1")
        return out


def _check_supported(req: _Sampled) -> None:
    if unsupported := req._unsupported():
        raise BadRequest(f"not supported by lmedge's engines: {'; '.join(unsupported)}")


class ImageGenerationRequest(_Lenient):
    model: str = Field(min_length=1, max_length=63)
    prompt: str = Field(min_length=1, max_length=MAX_PROMPT_CHARS)
    n: int = Field(default=1, ge=1, le=MAX_PROMPTS)
    response_format: Literal["b64_json", "url"] | None = "b64_json"
    size: str | None = None


def _stream_options(req: ChatCompletionRequest | CompletionRequest) -> None:
    _check_supported(req)
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
    image = images[0] if images else None
    prompt = Prompt(text=text, image=image, max_tokens=limit, sampling=req.sampling())
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
    if len(texts) * req.n > MAX_PROMPTS:
        raise BadRequest(
            f"{len(texts)} prompts x n={req.n} is more than {MAX_PROMPTS} completions per request"
        )
    sampling = req.sampling()
    # OpenAI's order: the n choices of the first prompt, then those of the next
    return [
        Prompt(text=t, max_tokens=req.max_tokens, sampling=sampling)
        for t in texts
        for _ in range(req.n)
    ]


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
    if req.n != 1:
        raise BadRequest(f"n must be 1 when stream is true (got {req.n}): one stream, one choice")
    if isinstance(req, ChatCompletionRequest):
        prompts = chat_prompts(req, modality)
        # what _check_supported let through of the tool fields is empty: not sent
        unsent = {"tool_calls", "tool_call_id", "function_call", "audio"}
        messages = [
            m.model_dump(mode="json", exclude_none=True, exclude=unsent) for m in req.messages
        ]
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
