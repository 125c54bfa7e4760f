"""OpenAI-compatible requests become prompt sets; wrong kinds get one clear 400."""

from __future__ import annotations

import base64

import pytest
from pydantic import ValidationError

from lmedge.api.inference import MAX_IMAGE_CHARS, Prompt, Sampling
from lmedge.dataplane.openai import (
    BadRequest,
    ChatCompletionRequest,
    CompletionRequest,
    ImageGenerationRequest,
    chat_prompts,
    completion_prompts,
    image_prompts,
)

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\nrest").decode()


def _chat(content: object, **kw: object) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate(
        {"model": "lm1", "messages": [{"role": "user", "content": content}], **kw}
    )


def test_chat_joins_texts_and_repeats_n_times() -> None:
    req = ChatCompletionRequest.model_validate({
        "model": "lm1", "n": 3, "max_completion_tokens": 9, "temperature": 0.2,
        "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
    })  # fmt: skip
    prompts = chat_prompts(req, "text-to-text")
    assert len(prompts) == 3 and prompts[0].text == "be brief\nhi" and prompts[0].max_tokens == 9


def test_chat_image_part_becomes_prompt_image() -> None:
    req = _chat([
        {"type": "text", "text": "what is this"},
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
    ])  # fmt: skip
    [prompt] = chat_prompts(req, "image-to-text")
    assert prompt.image == PNG and prompt.text == "what is this"


@pytest.mark.parametrize(
    ("content", "modality", "kw", "message"),
    [
        ("hi", "text-to-text", {"stream_options": {"include_usage": True}},
         "only allowed when stream is true"),
        ("hi", "text-to-image", {}, "use the matching endpoint"),
        ("hi", "image-to-text", {}, "exactly one image_url"),
        ([{"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}}],
         "text-to-text", {}, "takes no images"),
        ([{"type": "image_url", "image_url": {"url": "http://x/cat.png"}}], "image-to-text", {},
         "does not fetch remote images"),
        ([{"type": "image_url", "image_url": {"url": "data:image/png;base64,@@@"}}],
         "image-to-text", {}, "data: URL"),
        ("", "text-to-text", {}, "no text"),
    ],
    ids=["stream-options-without-stream", "wrong-kind", "missing-image", "image-to-text-lm",
         "remote-url", "bad-base64", "empty"],
)  # fmt: skip
def test_chat_rejections(
    content: object, modality: str, kw: dict[str, object], message: str
) -> None:
    with pytest.raises(BadRequest, match=message):
        chat_prompts(_chat(content, **kw), modality)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kw", "sampling"),
    [
        ({}, None),
        ({"stop": "\n"}, Sampling(stop=["\n"])),
        ({"temperature": 0.0, "seed": 7, "top_p": 0.5, "stop": ["a", "b"],
          "presence_penalty": 1.0, "frequency_penalty": -1.0},
         Sampling(temperature=0.0, seed=7, top_p=0.5, stop=["a", "b"], presence_penalty=1.0,
                  frequency_penalty=-1.0)),
        ({"user": "u1"}, None),
    ],
    ids=["none", "one-stop-string", "all", "advisory-only"],
)  # fmt: skip
def test_sampling_parameters_go_with_every_prompt(
    kw: dict[str, object], sampling: Sampling | None
) -> None:
    chat = _chat("hi", n=2, **kw)
    assert [p.sampling for p in chat_prompts(chat, "text-to-text")] == [sampling] * 2
    completion = CompletionRequest.model_validate({"model": "lm1", "prompt": "x", **kw})
    [prompt] = completion_prompts(completion, "text-to-text")
    assert prompt.sampling == sampling


def test_completion_n_repeats_each_prompt_in_openai_order() -> None:
    req = CompletionRequest(model="lm1", prompt=["a", "b"], n=2)
    assert [p.text for p in completion_prompts(req, "text-to-text")] == ["a", "a", "b", "b"]
    with pytest.raises(BadRequest, match="more than 64 completions"):
        completion_prompts(CompletionRequest(model="lm1", prompt=["a"] * 33, n=2), "text-to-text")


def test_completions_and_images() -> None:
    many = CompletionRequest(model="lm1", prompt=["a", "b"], max_tokens=3)
    assert [p.text for p in completion_prompts(many, "text-to-text")] == ["a", "b"]
    with pytest.raises(BadRequest, match="empty list"):
        completion_prompts(CompletionRequest(model="lm1", prompt=[]), "text-to-text")
    with pytest.raises(BadRequest, match="completions need text-to-text"):
        completion_prompts(CompletionRequest(model="lm3", prompt="x"), "image-to-text")
    images = ImageGenerationRequest(model="lm4", prompt="a cat", n=2)
    assert len(image_prompts(images, "text-to-image")) == 2
    with pytest.raises(BadRequest, match="use b64_json"):
        image_prompts(
            ImageGenerationRequest(model="lm4", prompt="x", response_format="url"), "text-to-image"
        )


@pytest.mark.parametrize("data", ["   ", "\n\t "], ids=["spaces", "whitespace"])
def test_a_blank_image_is_refused_on_both_endpoints(data: str) -> None:
    url = f"data:image/png;base64,{data}"
    req = _chat([{"type": "image_url", "image_url": {"url": url}}])
    with pytest.raises(BadRequest, match="empty"):
        chat_prompts(req, "image-to-text")
    for native in (data, ""):
        with pytest.raises(ValidationError, match="image is empty"):
            Prompt(image=native)


@pytest.mark.parametrize(
    ("content", "where"),
    [
        ([{"type": "image_url"}], ("messages", 0, "content", "parts", 0, "image_url", "image_url")),
        ([{"type": "text", "text": 5}], ("messages", 0, "content", "parts", 0, "text", "text")),
        (5, ("messages", 0, "content", "text")),
    ],
    ids=["image-part-without-url", "text-part-not-a-string", "not-a-string-nor-a-list"],
)
def test_a_content_error_names_the_branch_that_was_sent(content: object, where: tuple) -> None:
    with pytest.raises(ValidationError) as exc:
        _chat(content)
    assert [e["loc"] for e in exc.value.errors()] == [where]


def test_an_image_over_the_native_bound_is_a_validation_error() -> None:
    big = "A" * (MAX_IMAGE_CHARS + 4)
    with pytest.raises(ValidationError, match=f"at most {MAX_IMAGE_CHARS}"):
        _chat([{"type": "image_url", "image_url": {"url": f"data:image/png;base64,{big}"}}])
    # whitespace does not count: the same image wrapped in lines is within the bound
    wrapped = "\n".join(PNG for _ in range(3))
    assert _chat([{"type": "image_url", "image_url": {"url": f"data:image/png;base64,{wrapped}"}}])
