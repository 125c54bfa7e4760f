"""The OpenAI parameters of chat completions and completions, with the `openai` SDK
against a real gateway and stub model server on 127.0.0.1: every documented one
accepted, an unknown one (sent with `extra_body`) a 400 naming it, and those the
engines cannot honour a 400 saying so."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest

from lmedge.dataplane.records import MemorySink
from tests.fixtures.dataplane import TOKEN, ServerThread, gateway, model_server

CHAT = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[openai.OpenAI]:
    pod = model_server("lm1", tmp_path_factory.mktemp("pod"))
    _, srv = gateway("worker-1", MemorySink(), models={"lm1": pod.url})
    servers: list[ServerThread] = [srv, pod]
    yield openai.OpenAI(base_url=srv.url + "/v1", api_key=TOKEN, max_retries=0, timeout=30)
    for s in servers:
        s.stop()


def test_every_documented_chat_parameter_is_accepted(client: openai.OpenAI) -> None:
    answer = client.chat.completions.create(
        model="lm1",
        messages=[
            {"role": "system", "content": "be brief", "name": "rules"},
            {"role": "assistant", "content": "ok", "refusal": None, "tool_calls": []},
            {"role": "user", "content": "hello", "name": "ada"},
        ],
        max_completion_tokens=8, n=2, temperature=0.7, top_p=0.9, seed=7, stop=["\n", "."],
        presence_penalty=0.5, frequency_penalty=-0.5, logit_bias={}, logprobs=False,
        user="u1", safety_identifier="s1", prompt_cache_key="k1", metadata={"team": "edge"},
        store=False, service_tier="auto", parallel_tool_calls=False, tools=[],
        tool_choice="none", response_format={"type": "text"}, modalities=["text"],
        prediction={"type": "content", "content": "hi"},
    )  # fmt: skip
    assert [c.index for c in answer.choices] == [0, 1]
    assert all(c.message.content for c in answer.choices)


def test_every_documented_completion_parameter_is_accepted(client: openai.OpenAI) -> None:
    answer = client.completions.create(
        model="lm1", prompt=["a", "b"], n=2, max_tokens=4, temperature=0.0, top_p=1.0, seed=1,
        stop="\n", presence_penalty=0.0, frequency_penalty=0.0, logit_bias={}, user="u1",
        best_of=1, echo=False, suffix=None,
    )  # fmt: skip
    assert len(answer.choices) == 4  # n choices per prompt


@pytest.mark.parametrize(
    ("endpoint", "extra"),
    [
        ("chat", {"temprature": 0.5}),
        ("completions", {"max_new_tokens": 4}),
        ("chat", {"top_k": 40}),
    ],
    ids=["misspelt-chat", "completion", "engine-specific"],
)
def test_an_unknown_argument_is_a_400_naming_it(
    client: openai.OpenAI, endpoint: str, extra: dict[str, Any]
) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        if endpoint == "chat":
            client.chat.completions.create(model="lm1", messages=CHAT, extra_body=extra)
        else:
            client.completions.create(model="lm1", prompt="a", extra_body=extra)
    [name] = extra
    assert refused.value.status_code == 400
    assert refused.value.body == {
        "message": f"Unrecognized request argument supplied: {name}",
        "type": "invalid_request_error",
        "code": None,
    }


def test_an_unknown_message_field_is_a_400_naming_it(client: openai.OpenAI) -> None:
    messages: Any = [{"role": "user", "content": "hi", "speaker": "ada"}]
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="lm1", messages=messages)
    assert "messages.0" in refused.value.message and "speaker" in refused.value.message


@pytest.mark.parametrize(
    ("kw", "says"),
    [
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]},
         "tools"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"logprobs": True, "top_logprobs": 2}, "logprobs"),
        ({"logit_bias": {"50256": -100}}, "logit_bias"),
        ({"response_format": {"type": "json_object"}}, "response_format 'json_object'"),
        ({"modalities": ["text", "audio"], "audio": {"voice": "alloy", "format": "wav"}},
         "audio"),
        ({"reasoning_effort": "low"}, "reasoning_effort"),
        ({"messages": [{"role": "tool", "content": "42", "tool_call_id": "c1"}]}, "tool calls"),
        ({"n": 2, "stream": True}, "n must be 1"),
    ],
    ids=["tools", "tool-choice", "logprobs", "logit-bias", "json", "audio", "reasoning",
         "tool-message", "n-on-stream"],
)  # fmt: skip
def test_what_the_engines_cannot_honour_is_a_400_saying_so(
    client: openai.OpenAI, kw: dict[str, Any], says: str
) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="lm1", **{"messages": CHAT, **kw})
    assert says in refused.value.message


@pytest.mark.parametrize(
    ("kw", "says"),
    [
        ({"best_of": 3}, "best_of"),
        ({"echo": True}, "echo"),
        ({"suffix": "end"}, "suffix"),
        ({"logprobs": 1}, "logprobs"),
    ],
    ids=["best-of", "echo", "suffix", "logprobs"],
)
def test_completion_options_the_engines_cannot_honour_are_a_400(
    client: openai.OpenAI, kw: dict[str, Any], says: str
) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(model="lm1", prompt="a", **kw)
    assert says in refused.value.message


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"temperature": 2.5}, "temperature"),
        ({"top_p": 1.5}, "top_p"),
        ({"presence_penalty": -3}, "presence_penalty"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ],
    ids=["temperature", "top-p", "penalty", "five-stops"],
)
def test_sampling_values_out_of_openai_ranges_are_refused_by_name(
    client: openai.OpenAI, kw: dict[str, Any], field: str
) -> None:
    with pytest.raises(openai.UnprocessableEntityError) as refused:
        client.chat.completions.create(model="lm1", messages=CHAT, **kw)
    assert isinstance(refused.value.body, dict)
    assert refused.value.body["message"].startswith(field)
