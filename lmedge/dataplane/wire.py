"""The gateway's own messages: the native prompt-set API and gateway-to-gateway
forwarding.

The OpenAI-compatible shapes are in `lmedge.dataplane.openai`; what the gateway
sends a model pod is in `lmedge.api.inference`; the control pushes (routing map,
local model pods) are in `lmedge.api.gateway_control`, since the controller and
the node agent, which send them, may not import the data plane.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

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
    node: str
    run: str
    slot: int
    routes: int
    active: list[str]
    queue_depth: dict[str, int]
