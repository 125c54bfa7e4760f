"""OpenAI-compatible requests become prompt sets; wrong kinds get one clear 400."""

from __future__ import annotations

import base64

import pytest

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
