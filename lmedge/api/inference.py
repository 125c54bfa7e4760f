"""What a model server is asked and answers: the gateway <-> model pod contract.

The gateway (`lmedge.dataplane`) and the model server (`lmedge.modelserver`) are
independent siblings in the layering, so the messages they exchange live here.
A request is a *prompt set*: K prompts for one LM, processed in order. Images
travel base64-encoded inside JSON (one request body, no multipart), which keeps
the progress file and the OpenAI `b64_json` responses in one format.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator

from lmedge.api.base import WireModel

#: Most prompts in one prompt set; the paper's sets have K <= 8.
MAX_PROMPTS = 64
#: Longest text of one prompt, characters.
MAX_PROMPT_CHARS = 32_768
#: Largest base64 image of one prompt, characters (~6 MiB decoded).
MAX_IMAGE_CHARS = 8 * 1024 * 1024


#: OpenAI's ranges for the sampling parameters, one home for the gateway's
#: request models and the engine contract.
Temperature = Annotated[float, Field(ge=0, le=2)]
TopP = Annotated[float, Field(ge=0, le=1)]
Penalty = Annotated[float, Field(ge=-2, le=2)]
Seed = Annotated[int, Field(ge=-(2**63), lt=2**63)]
#: Most stop sequences of one request (OpenAI: up to 4).
MAX_STOP = 4
StopText = Annotated[str, Field(min_length=1, max_length=256)]


class Sampling(WireModel):
    """How an engine samples a prompt's output; None: the engine's default.

    Forwarded as is to an OpenAI-speaking engine (llama.cpp, vLLM), which
    honours every field; a pipeline model server generates with its own
    settings. `seed` makes a run reproducible on the same engine build and
    hardware, as OpenAI's does (best effort, not across engines).
    """

    temperature: Temperature | None = None
    top_p: TopP | None = None
    seed: Seed | None = None
    stop: list[StopText] | None = Field(default=None, min_length=1, max_length=MAX_STOP)
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None


class Prompt(WireModel):
    """One prompt: text, an image (base64 PNG/JPEG), or both (image-to-text with a hint)."""

    text: str = Field(default="", max_length=MAX_PROMPT_CHARS, description="Prompt text.")
    image: str | None = Field(
        default=None,
        max_length=MAX_IMAGE_CHARS,
        description="Base64-encoded image, no data: prefix.",
    )
    max_tokens: int | None = Field(
        default=None,
        ge=1,
        le=4096,
        description="Most new tokens for text output; server default if unset.",
    )
    sampling: Sampling | None = Field(
        default=None, description="Sampling parameters for the engine; its defaults if unset."
    )

    @field_validator("image")
    @classmethod
    def _image_not_blank(cls, image: str | None) -> str | None:
        # An empty or whitespace-only image decodes to no bytes: not an image.
        if image is not None and (not image or image.isspace()):
            raise ValueError("the image is empty (whitespace only): send a base64 image or none")
        return image


class Output(WireModel):
    """The result of one prompt: text, or an image (base64 PNG).

    Token counts are what the model server's tokenizer counted; None when it
    did not count (images, or a server that does not report them).
    """

    text: str | None = None
    image: str | None = None
    prompt_tokens: int | None = Field(default=None, ge=0, description="Tokens of the prompt.")
    completion_tokens: int | None = Field(
        default=None, ge=0, description="Tokens generated for the output text."
    )


class InferRequest(WireModel):
    """A prompt set sent to a model server's `/infer`.

    `id` names the set: a repeated call with the same id resumes at the first
    prompt not yet finished (the progress is kept on a host path), so a
    restarted pod never repeats a prompt. `budget_s` is the time left until the
    request's deadline; the server starts no prompt after it has elapsed.
    """

    id: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._-]+$")
    lm: str = Field(min_length=1, max_length=63)
    prompts: list[Prompt] = Field(max_length=MAX_PROMPTS)
    budget_s: float | None = Field(default=None, gt=0, description="Seconds until the deadline.")


class InferResult(WireModel):
    """A model server's answer: outputs in prompt order, and compute time.

    `outputs` holds the finished prompts (all of them unless `complete` is
    False, which happens only when `budget_s` ran out). `inference_s` is the
    compute time of every prompt of the set, including those finished by an
    earlier process before a restart.
    """

    id: str
    lm: str
    outputs: list[Output]
    complete: bool
    inference_s: float = Field(ge=0)
    mode: Literal["gpu", "cpu"]
    resumed_from: int = Field(default=0, ge=0, description="Prompts already done when called.")


class StreamChunk(WireModel):
    """One server-sent event of a model server's `/infer/stream` (one prompt, text out).

    Pieces of generated text (`text`) arrive as the model decodes them; the last
    event has `done` True, the token counts of the model's tokenizer and the
    compute time; an event with `error` ends a stream that failed after it began.
    """

    text: str = ""
    done: bool = False
    error: str | None = None
    prompt_tokens: int | None = Field(default=None, ge=0)
    completion_tokens: int | None = Field(default=None, ge=0)
    inference_s: float | None = Field(default=None, ge=0)
    mode: Literal["gpu", "cpu"] | None = None
