"""How the gateway streams from a model pod: one small adapter per pod protocol.

A pod registers with a `protocol` (`lmedge.api.gateway_control.ModelEndpoint`):

* `pipeline`: `lmedge model-server`; `POST /infer/stream` with an
  `InferRequest` of one prompt, answering `StreamChunk` events
  (`PipelineProtocol`);
* `openai`: an engine that speaks the OpenAI API itself (llama.cpp, vLLM);
  `POST /v1/chat/completions` (or `/v1/completions` for a completion) with
  `stream: true` and `stream_options.include_usage`, the prompt's
  `max_tokens` and its sampling parameters (temperature, top_p, seed, stop,
  presence/frequency penalty, under OpenAI's names), answering OpenAI chunks
  and `[DONE]` (`OpenAIProtocol`).

An adapter says what to POST (`request`) and reads the pod's events into
engine-neutral `Piece`s and one final `Finish` (`reader`). It does no I/O: the
httpx stream is in `lmedge.dataplane.clients`. A stream that is not what the
protocol promises (data that is not JSON, a chunk of the wrong shape, an
`error` event, a stream that ends before its last event) raises
`MalformedStream` or `ModelFailed`, which the destination turns into a
`failed` end. Only text streams: `n` is always 1.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from pydantic import ValidationError

from lmedge.api.gateway_control import PodProtocol
from lmedge.api.inference import InferRequest, Prompt, StreamChunk
from lmedge.dataplane.sse import MalformedStream, SseEvent
from lmedge.errors import ModelFailed

__all__ = [
    "EngineCall",
    "Finish",
    "OpenAIProtocol",
    "Piece",
    "PipelineProtocol",
    "PodStreamProtocol",
    "StreamReader",
    "pod_protocol",
]

FinishReason = Literal["stop", "length"]


@dataclass(frozen=True)
class EngineCall:
    """One streamed prompt for a pod: the set id, LM, prompt and (chat) messages."""

    id: str
    lm: str
    prompt: Prompt
    messages: list[dict[str, Any]] | None = None
    budget_s: float | None = None


@dataclass(frozen=True)
class Piece:
    """Generated text, as the engine sent it."""

    text: str


@dataclass(frozen=True)
class Finish:
    """The end of a stream: the engine's token counts (None: not reported) and why it stopped."""

    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: FinishReason | None = None
    mode: Literal["gpu", "cpu"] | None = None


class StreamReader(Protocol):
    """Reads one stream's events in order; `finish` after the last."""

    def event(self, event: SseEvent) -> Piece | None:
        """The text an event carries, if any; raises on a malformed or error event."""
        ...

    def finish(self) -> Finish:
        """The stream's end; `MalformedStream` if it stopped before its last event."""
        ...


class PodStreamProtocol(Protocol):
    """What to POST to a pod for a stream, and how to read its answer."""

    def request(self, call: EngineCall) -> tuple[str, dict[str, Any]]:
        """(path, JSON body) of the streaming call."""
        ...

    def reader(self) -> StreamReader: ...


def _json(data: str, who: str) -> Any:
    try:
        return json.loads(data)
    except json.JSONDecodeError as exc:
        raise MalformedStream(f"{who} sent an event that is not JSON: {data[:120]!r}") from exc


class _PipelineReader:
    def __init__(self) -> None:
        self._finish: Finish | None = None

    def event(self, event: SseEvent) -> Piece | None:
        if self._finish is not None:
            raise MalformedStream("model server sent an event after its last")
        try:
            chunk = StreamChunk.model_validate_json(event.data)
        except ValidationError as exc:
            raise MalformedStream(
                f"model server sent a malformed stream event: {event.data[:120]!r}"
            ) from exc
        if chunk.error is not None:
            raise ModelFailed(f"model server failed mid-stream: {chunk.error}")
        if chunk.done:
            self._finish = Finish(
                prompt_tokens=chunk.prompt_tokens,
                completion_tokens=chunk.completion_tokens,
                finish_reason="stop",
                mode=chunk.mode,
            )
        return Piece(chunk.text) if chunk.text else None

    def finish(self) -> Finish:
        if self._finish is None:
            raise MalformedStream("model server's stream ended before its last event")
        return self._finish


class PipelineProtocol:
    """`lmedge model-server`: `/infer/stream`, `StreamChunk` events."""

    def request(self, call: EngineCall) -> tuple[str, dict[str, Any]]:
        body = InferRequest(id=call.id, lm=call.lm, prompts=[call.prompt], budget_s=call.budget_s)
        return "/infer/stream", body.model_dump(mode="json", exclude_none=True)

    def reader(self) -> StreamReader:
        return _PipelineReader()


class _OpenAIReader:
    def __init__(self) -> None:
        self._done = False
        self._reason: FinishReason | None = None
        self._usage: dict[str, Any] | None = None

    def event(self, event: SseEvent) -> Piece | None:
        if self._done:
            raise MalformedStream("engine sent an event after [DONE]")
        if event.data.strip() == "[DONE]":
            self._done = True
            return None
        chunk = _json(event.data, "engine")
        if not isinstance(chunk, dict):
            raise MalformedStream(
                f"engine sent a chunk that is not an object: {event.data[:120]!r}"
            )
        if event.event == "error" or "error" in chunk:
            error = chunk.get("error")
            message = error.get("message") if isinstance(error, dict) else error
            raise ModelFailed(f"engine failed mid-stream: {message or event.data[:200]}")
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self._usage = usage
        choices = chunk.get("choices")
        if not isinstance(choices, list):
            raise MalformedStream(f"engine sent a chunk without choices: {event.data[:120]!r}")
        text = ""
        for choice in choices:
            if not isinstance(choice, dict):
                raise MalformedStream(f"engine sent a malformed choice: {event.data[:120]!r}")
            delta = choice.get("delta")
            piece = delta.get("content") if isinstance(delta, dict) else choice.get("text")
            if piece is not None and not isinstance(piece, str):
                raise MalformedStream(f"engine sent non-text content: {event.data[:120]!r}")
            text += piece or ""
            reason = choice.get("finish_reason")
            if reason is not None:
                self._reason = "length" if reason == "length" else "stop"
        return Piece(text) if text else None

    def finish(self) -> Finish:
        if not self._done:
            raise MalformedStream("engine's stream ended before [DONE]")
        usage = self._usage or {}
        prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
        return Finish(
            prompt_tokens=prompt if isinstance(prompt, int) and prompt >= 0 else None,
            completion_tokens=completion
            if isinstance(completion, int) and completion >= 0
            else None,
            finish_reason=self._reason,
        )


class OpenAIProtocol:
    """An OpenAI-speaking engine (llama.cpp, vLLM): chat or completions, streamed."""

    def request(self, call: EngineCall) -> tuple[str, dict[str, Any]]:
        body: dict[str, Any] = {
            "model": call.lm,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if call.prompt.max_tokens is not None:
            body["max_tokens"] = call.prompt.max_tokens
        if call.prompt.sampling is not None:  # OpenAI's names, which both engines take
            body.update(call.prompt.sampling.model_dump(mode="json", exclude_none=True))
        if call.messages is not None:
            return "/v1/chat/completions", {**body, "messages": call.messages}
        return "/v1/completions", {**body, "prompt": call.prompt.text}

    def reader(self) -> StreamReader:
        return _OpenAIReader()


_PROTOCOLS: dict[str, PodStreamProtocol] = {
    "pipeline": PipelineProtocol(),
    "openai": OpenAIProtocol(),
}


def pod_protocol(name: PodProtocol) -> PodStreamProtocol:
    """The adapter of a pod protocol named in a pod's registration."""
    return _PROTOCOLS[name]
