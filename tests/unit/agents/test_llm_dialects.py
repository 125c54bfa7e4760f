"""The LLM client's dialect memory over an HTTP mock (httpx2, the transport of
the openai SDK): error sequences, on a fake clock.

One refusal naming the output format moves that call to the next dialect;
only `DIALECT_REFUSALS` in a row make the endpoint's dialect (and its
serialisation) stick, and a remembered lesser dialect is re-probed after
`REPROBE_S`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx2
import openai
import pytest
from pydantic import BaseModel

from lmedge.agents import llm
from lmedge.agents.llm import DIALECT_REFUSALS, REPROBE_S, LLMClient, forget_endpoint_capabilities
from lmedge.agents.settings import resolve_settings


class Pick(BaseModel):
    x: int


def _dialect(request: httpx2.Request) -> str:
    fmt = json.loads(request.content)["response_format"]
    if fmt["type"] == "json_schema":
        return "json_schema"
    return "json_object_schema" if "schema" in fmt else "json_object"


#: llama-cpp-python's refusal of `json_schema` (HTTP 500, the field named in a pydantic dump).
REFUSAL = {"error": {"message": "1 validation error: ('body', 'response_format', 'type')"}}
COMPLETION = {
    "choices": [{"message": {"role": "assistant", "content": '{"x": 1}'}}],
    "usage": {"prompt_tokens": 5, "completion_tokens": 3},
}


class Endpoint:
    """A chat endpoint answering each json_schema request from a script (else 200)."""

    def __init__(self) -> None:
        self.script: list[int] = []
        self.asked: list[str] = []

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        dialect = _dialect(request)
        self.asked.append(dialect)
        if dialect == "json_schema" and self.script and self.script.pop(0) != 200:
            return httpx2.Response(500, json=REFUSAL)
        return httpx2.Response(200, json=COMPLETION)


@pytest.fixture
def endpoint() -> Iterator[Endpoint]:
    forget_endpoint_capabilities()
    yield Endpoint()
    forget_endpoint_capabilities()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _client(endpoint: Endpoint, clock: Clock) -> LLMClient:
    settings = resolve_settings("deployer", {"llm_base_url": "http://llm.test/v1"}, env={})
    http = openai.DefaultHttpxClient(transport=httpx2.MockTransport(endpoint))
    return LLMClient(settings, clock=clock, http_client=http)


def _ask(client: LLMClient) -> llm.LLMReply[Pick]:
    reply = client.ask("system", "user", Pick, "pick")
    assert reply.value == Pick(x=1), reply.error
    return reply


@pytest.mark.parametrize(
    ("script", "remembered"),
    [
        ([500], "json_schema"),
        ([500] * (DIALECT_REFUSALS - 1), "json_schema"),
        ([500] * DIALECT_REFUSALS, "json_object_schema"),
        ([500, 200, 500, 200], "json_schema"),
        ([500, 500, 200, 500, 500], "json_schema"),
    ],
    ids=["one-transient", "short-of-the-count", "repeated", "interleaved", "reset-by-a-success"],
)
def test_only_repeated_refusals_degrade_and_serialise_the_endpoint(
    endpoint: Endpoint, script: list[int], remembered: str
) -> None:
    endpoint.script = list(script)
    client = _client(endpoint, Clock())
    for _ in script:
        _ask(client)
    assert client.output_mode() == remembered
    assert client.serial() is (remembered != "json_schema")
    client.close()


def test_a_refused_call_is_answered_in_the_next_dialect_at_once(endpoint: Endpoint) -> None:
    endpoint.script = [500]
    client = _client(endpoint, Clock())
    reply = _ask(client)
    assert endpoint.asked == ["json_schema", "json_object_schema"]
    assert reply.mode == "json_object_schema" and reply.calls == 2
    # the next call asks in the endpoint's best dialect again
    _ask(client)
    assert endpoint.asked[2:] == ["json_schema"]
    client.close()


@pytest.mark.parametrize(
    ("probe", "after"),
    [(200, "json_schema"), (500, "json_object_schema")],
    ids=["probe-accepted", "probe-refused"],
)
def test_a_remembered_lesser_dialect_is_re_probed(
    endpoint: Endpoint, probe: int, after: str
) -> None:
    clock = Clock()
    endpoint.script = [500] * DIALECT_REFUSALS
    client = _client(endpoint, clock)
    for _ in range(DIALECT_REFUSALS):
        _ask(client)
    assert client.output_mode() == "json_object_schema"
    endpoint.asked.clear()
    _ask(client)
    assert endpoint.asked == ["json_object_schema"], "inside the period: the remembered dialect"
    clock.now += REPROBE_S
    endpoint.script = [probe]
    endpoint.asked.clear()
    _ask(client)
    assert endpoint.asked[0] == "json_schema"
    assert client.output_mode() == after
    assert client.serial() is (after != "json_schema")
    # one probe a period: the next call starts in whatever the probe found
    endpoint.asked.clear()
    _ask(client)
    assert endpoint.asked == [after]
    client.close()
