"""The gateway's own messages: the native prompt-set API and gateway-to-gateway
forwarding.

The OpenAI-compatible shapes are in `lmedge.dataplane.openai`; what the gateway
sends a model pod is in `lmedge.api.inference`; the control pushes (routing map,
local model pods) are in `lmedge.api.gateway_control`, since the controller and
the node agent, which send them, may not import the data plane.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, TypeAdapter

from lmedge.api.base import WireModel
from lmedge.api.gateway_control import LocalModels, ModelEndpoint, RoutingUpdate
from lmedge.api.inference import MAX_PROMPTS, Output, Prompt
from lmedge.api.records import RequestOutcome

__all__ = [
    "ForwardRequest",
    "ForwardResult",
    "GatewayStatus",
    "LocalModels",
    "ModelEndpoint",
    "PromptSetRequest",
    "PromptSetResult",
    "RoutingUpdate",
    "StageTimes",
    "StreamEnd",
    "StreamEvent",
    "StreamForward",
    "StreamStart",
    "StreamText",
    "stream_event",
]

_ID = r"^[A-Za-z0-9._-]+$"


class PromptSetRequest(WireModel):
    """`POST /v1/prompt-sets`: K prompts for one LM, submitted at this node."""

    lm: str = Field(min_length=1, max_length=63, description="LM service name.")
    prompts: list[Prompt] = Field(min_length=1, max_length=MAX_PROMPTS)
    id: str | None = Field(
        default=None, min_length=1, max_length=128, pattern=_ID, description="Optional request id."
    )


class StageTimes(WireModel):
    uplink_s: float = Field(ge=0)
    queue_s: float = Field(ge=0)
    inference_s: float = Field(ge=0)
    downlink_s: float = Field(ge=0)


class PromptSetResult(WireModel):
    """The answer of the native API: outputs plus the request's record fields."""

    id: str
    lm: str
    model: str | None = Field(
        default=None, description="LM that served it when `lm` is a request class."
    )
    origin: str
    destination: str
    outcome: RequestOutcome
    conflict: bool
    prompts: int
    prompts_done: int
    outputs: list[Output]
    times: StageTimes
    error: str | None = None


class ForwardRequest(WireModel):
    """`POST /internal/forward`: a prompt set handed to the destination's gateway.

    `sent_at` is the origin's wall clock (Unix seconds) when it sent the set,
    used for the uplink time; `budget_s` is the time left until tau.
    """

    id: str = Field(min_length=1, max_length=128, pattern=_ID)
    lm: str = Field(min_length=1, max_length=63)
    origin: str = Field(min_length=1, max_length=63)
    prompts: list[Prompt] = Field(max_length=MAX_PROMPTS)
    sent_at: float = Field(ge=0)
    budget_s: float = Field(gt=0)


class ForwardResult(WireModel):
    """The destination's answer: outputs and the stages it measured."""

    id: str
    destination: str
    received_at: float = Field(ge=0, description="Destination wall clock on arrival, Unix s.")
    queue_s: float = Field(ge=0)
    inference_s: float = Field(ge=0)
    outcome: RequestOutcome
    conflict: bool
    mode: Literal["gpu", "cpu", "none"]
    outputs: list[Output]
    error: str | None = None


class GatewayStatus(WireModel):
    """`GET /control/status`. `windows`: under request-level routing, windows decided
    and requests routed so far, and how many windows went by the `router`, the
    `seed` and the `map` (None: the map routes)."""

    node: str
    run: str
    slot: int
    routes: int
    active: list[str]
    queue_depth: dict[str, int]
    windows: dict[str, int] | None = None


class StreamForward(WireModel):
    """`POST /internal/stream`: one streamed prompt handed to the destination's gateway.

    As `ForwardRequest`, for one prompt. `messages` are the chat messages as the
    user sent them (an OpenAI-speaking engine applies its own chat template to
    them); None for a completion. A pipeline pod gets `prompt`, where the
    messages' texts are already joined.
    """

    id: str = Field(min_length=1, max_length=128, pattern=_ID)
    lm: str = Field(min_length=1, max_length=63)
    origin: str = Field(min_length=1, max_length=63)
    prompt: Prompt
    messages: list[dict[str, Any]] | None = Field(default=None, max_length=256)
    sent_at: float = Field(ge=0)
    budget_s: float = Field(gt=0)


class StreamStart(WireModel):
    """The destination took the LM's pod for the stream: what the queue took."""

    type: Literal["start"] = "start"
    destination: str
    received_at: float = Field(ge=0, description="Destination wall clock on arrival, Unix s.")
    queue_s: float = Field(ge=0)
    conflict: bool


class StreamText(WireModel):
    """A piece of generated text, as the engine sent it."""

    type: Literal["text"] = "text"
    text: str


class StreamEnd(WireModel):
    """The last event of a stream from a destination: how it ended and what it measured.

    `prefill_s` is from taking the pod to the first piece, `decode_s` from the
    first piece to the end. `completion_tokens` is the engine's count, or the
    pieces received when the engine reports none. `invalid`: the engine refused
    the input before generating (a prompt too long for its context).
    """

    type: Literal["end"] = "end"
    destination: str
    outcome: RequestOutcome
    error: str | None = None
    invalid: bool = False
    received_at: float = Field(ge=0)
    queue_s: float = Field(ge=0)
    prefill_s: float = Field(default=0.0, ge=0)
    decode_s: float = Field(default=0.0, ge=0)
    conflict: bool = False
    mode: Literal["gpu", "cpu", "none"] = "none"
    prompt_tokens: int | None = Field(default=None, ge=0)
    completion_tokens: int | None = Field(default=None, ge=0)
    finish_reason: Literal["stop", "length"] | None = None


StreamEvent = Annotated[StreamStart | StreamText | StreamEnd, Field(discriminator="type")]

_STREAM_EVENT: TypeAdapter[StreamStart | StreamText | StreamEnd] = TypeAdapter(StreamEvent)


def stream_event(data: str) -> StreamStart | StreamText | StreamEnd:
    """Parse one event of `/internal/stream` (pydantic `ValidationError` if malformed)."""
    return _STREAM_EVENT.validate_json(data)
