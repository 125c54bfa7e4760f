"""Streaming end to end: the OpenAI SDK with `stream=True` against real gateways
and model servers on 127.0.0.1, served locally and forwarded to another node;
a client that leaves, an engine that dies, and bad input."""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from lmedge.api.inference import Output, Prompt
from lmedge.api.records import RequestRecord
from lmedge.dataplane.records import MemorySink
from lmedge.modelserver.app import ModelServer
from lmedge.modelserver.app import create_app as create_model_app
from lmedge.modelserver.backends import StubBackend
from tests.fixtures.dataplane import (
    TOKEN,
    ModelServerProcess,
    ServerThread,
    control,
    free_port,
    gateway,
)
from tests.fixtures.llama_server import N_CTX, LlamaServer

AUTH = {"Authorization": f"Bearer {TOKEN}"}
CHAT = [{"role": "user", "content": "tell me a story"}]


class CountingStub(StubBackend):
    """The stub, counting the pieces its streams produced (to see generation stop)."""

    produced: int = 0

    def stream(self, prompt: Prompt) -> Generator[Output, None, None]:
        for piece in super().stream(prompt):
            self.produced += 1
            yield piece


@dataclass
class Plane:
    """worker-1 (no pods; its sink holds the records) routes lm1 to worker-2 (a pod)."""

    a_url: str
    b_url: str
    sink: MemorySink
    b_sink: MemorySink
    backend: CountingStub
    pod: ModelServer

    def client(self, url: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=url + "/v1", api_key=TOKEN, max_retries=0, timeout=60)

    def record(
        self, match: Callable[[RequestRecord], bool], sink: MemorySink | None = None
    ) -> RequestRecord:
        """The first record matching, waiting for it (records are written as streams end)."""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            found = [r for r in (sink or self.sink).records if match(r)]
            if found:
                return found[0]
            time.sleep(0.05)
        raise AssertionError(f"no such record; have {(sink or self.sink).records}")


def _plane(tmp_path: Path, seconds: float) -> tuple[Plane, list[ServerThread]]:
    backend = CountingStub(lm="lm1", modality="text-to-text", seconds=seconds, context_tokens=64)
    pod = ModelServer("lm1", backend, tmp_path / "progress")
    pod_srv = ServerThread(create_model_app(pod, load_in_background=False)).start()
    port_a, port_b = free_port(), free_port()
    peers = {"worker-1": f"http://127.0.0.1:{port_a}", "worker-2": f"http://127.0.0.1:{port_b}"}
    sink, b_sink = MemorySink(), MemorySink()
    _, srv_b = gateway("worker-2", b_sink, peers=peers, port=port_b, models={"lm1": pod_srv.url})
    _, srv_a = gateway("worker-1", sink, peers=peers, port=port_a)
    routing = {"run": "it", "slot": 1, "routing": {"routes": [
        {"origin": "worker-1", "lm": "lm1", "destination": "worker-2"}]}}  # fmt: skip
    control(srv_a.url, "/control/routing", routing)
    return Plane(srv_a.url, srv_b.url, sink, b_sink, backend, pod), [srv_a, srv_b, pod_srv]


@pytest.fixture
def plane(tmp_path: Path) -> Iterator[Plane]:
    p, servers = _plane(tmp_path, seconds=0.05)
    yield p
    for s in servers:
        s.stop()


@pytest.fixture
def slow_plane(tmp_path: Path) -> Iterator[Plane]:
    """Pieces 2 s apart: a client can leave after the first, well before the last."""
    p, servers = _plane(tmp_path, seconds=10.0)
    yield p
    for s in servers:
        s.stop()


@pytest.mark.parametrize("at", ["forwarded", "local"])
def test_chat_streams_in_pieces_that_add_up_to_the_answer(plane: Plane, at: str) -> None:
    url, sink = (plane.a_url, plane.sink) if at == "forwarded" else (plane.b_url, plane.b_sink)
    client = plane.client(url)
    whole = client.chat.completions.create(model="lm1", messages=CHAT).choices[0].message.content
    stream = client.chat.completions.create(model="lm1", messages=CHAT, stream=True)
    chunks = list(stream)
    pieces = [
        c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content
    ]
    assert len(pieces) == StubBackend.STREAM_PIECES
    assert "".join(pieces) == whole
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices[0].finish_reason == "stop"
    rid = chunks[0].id.removeprefix("chatcmpl-")
    record = plane.record(lambda r: r.id == rid, sink)
    assert record.outcome == "success" and record.destination == "worker-2"
    assert record.ttft_s is not None and 0 < record.ttft_s < record.latency_s
    assert record.tpot_s is not None and record.tpot_s >= 0
    assert (record.input_tokens, record.output_tokens) == (4, 2)  # the stub counts words
    assert record.prefill_s is not None and record.decode_s is not None
    assert record.prefill_s + record.decode_s == pytest.approx(record.inference_s)
    assert record.latency_s == pytest.approx(
        record.uplink_s + record.queue_s + record.prefill_s + record.decode_s + record.downlink_s
    )


def test_completion_stream_with_usage_ends_with_a_usage_chunk(plane: Plane) -> None:
    client = plane.client(plane.a_url)
    whole = client.completions.create(model="lm1", prompt="one two three").choices[0].text
    chunks = list(
        client.completions.create(
            model="lm1", prompt="one two three", stream=True, stream_options={"include_usage": True}
        )
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (3, 2)
    assert all(c.usage is None for c in chunks[:-1])


@pytest.mark.parametrize(
    ("path", "body", "status", "says"),
    [
        ("/v1/chat/completions", {"messages": CHAT, "n": 2}, 400, "n must be 1"),
        ("/v1/completions", {"prompt": ["a", "b"]}, 400, "exactly one"),
        ("/v1/chat/completions", {"messages": CHAT, "stream_options": {"usage": True}}, 422,
         "stream_options.usage"),
        ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 100}, 400, "context of 64"),
    ],
    ids=["n-2", "two-prompts", "unknown-stream-option", "beyond-context"],
)  # fmt: skip
def test_bad_stream_requests_get_a_clear_error_before_any_event(
    plane: Plane, path: str, body: dict[str, Any], status: int, says: str
) -> None:
    response = httpx.post(
        plane.a_url + path, json={"model": "lm1", "stream": True, **body}, headers=AUTH, timeout=30
    )
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    assert says in response.json()["error"]["message"]


def test_refused_stream_is_an_immediate_429(plane: Plane) -> None:
    control(plane.a_url, "/control/routing", {"run": "it", "slot": 2, "slot_s": 30, "routing": {
        "routes": [], "rejections": [{"origin": "worker-1", "lm": "lm1"}]}})  # fmt: skip
    with pytest.raises(openai.RateLimitError):
        plane.client(plane.a_url).chat.completions.create(model="lm1", messages=CHAT, stream=True)
    assert plane.record(lambda r: r.outcome == "rejected").prompts == 1


def test_client_that_leaves_cancels_the_stream_and_frees_the_pod(slow_plane: Plane) -> None:
    plane = slow_plane
    body = {"model": "lm1", "messages": CHAT, "stream": True}
    with httpx.stream(
        "POST", plane.a_url + "/v1/chat/completions", json=body, headers=AUTH, timeout=60
    ) as response:
        assert response.status_code == 200
        lines = response.iter_lines()
        assert next(line for line in lines if '"content":"lm1:"' in line)
    # Closed after the first piece: the origin records it cancelled ...
    record = plane.record(lambda r: r.outcome == "cancelled")
    assert record.ttft_s is not None and record.output_tokens is not None
    assert 1 <= record.output_tokens < StubBackend.STREAM_PIECES
    # ... and the pod is free: the next stream is served, and the first one's
    # generation stopped before its last piece.
    chunks = list(plane.client(plane.a_url).chat.completions.create(
        model="lm1", messages=CHAT, stream=True))  # fmt: skip
    assert chunks[-1].choices[0].finish_reason == "stop"
    # A whole stream yields its pieces and one count; the left one stopped early.
    whole = StubBackend.STREAM_PIECES + 1
    assert plane.backend.produced - whole < whole - 1
    assert plane.record(lambda r: r.outcome == "success").destination == "worker-2"


def test_engine_that_dies_mid_stream_fails_it_with_an_error_event(tmp_path: Path) -> None:
    pod = ModelServerProcess("lm1", tmp_path / "progress", seconds=10.0).start()
    sink = MemorySink()
    _, srv = gateway("worker-1", sink, models={"lm1": pod.url})
    try:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key=TOKEN, max_retries=0, timeout=60)
        stream = client.chat.completions.create(model="lm1", messages=CHAT, stream=True)
        seen = []
        with pytest.raises(openai.APIError, match="failed"):
            for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    seen.append(chunk.choices[0].delta.content)
                    pod.kill()
        assert seen == ["lm1:"]
        deadline = time.monotonic() + 30
        while not sink.records and time.monotonic() < deadline:
            time.sleep(0.05)
        (record,) = sink.records
        assert record.outcome == "failed" and "model server" in (record.error or "")
        assert record.output_tokens == 1
    finally:
        srv.stop()
        pod.stop()


def test_openai_engine_pod_streams_through_two_gateways(
    llama_server: LlamaServer, tmp_path: Path
) -> None:
    """llama-cpp-python's OpenAI server as an `openai`-protocol pod of lm1 at worker-2."""
    port_a, port_b = free_port(), free_port()
    peers = {"worker-1": f"http://127.0.0.1:{port_a}", "worker-2": f"http://127.0.0.1:{port_b}"}
    sink = MemorySink()
    _, srv_b = gateway("worker-2", MemorySink(), peers=peers, port=port_b, tau=120)
    _, srv_a = gateway("worker-1", sink, peers=peers, port=port_a, tau=120)
    try:
        engine = llama_server.base_url.removesuffix("/v1")
        control(srv_b.url, "/control/models",
                {"models": [{"lm": "lm1", "url": engine, "protocol": "openai"}]})  # fmt: skip
        control(srv_a.url, "/control/routing", {"run": "it", "slot": 1, "routing": {"routes": [
            {"origin": "worker-1", "lm": "lm1", "destination": "worker-2"}]}})  # fmt: skip
        client = openai.OpenAI(base_url=srv_a.url + "/v1", api_key=TOKEN, max_retries=0,
                               timeout=120)  # fmt: skip
        chunks = list(client.completions.create(
            model="lm1", prompt="The capital of France is", max_tokens=8, stream=True))  # fmt: skip
        pieces = [c.choices[0].text for c in chunks if c.choices and c.choices[0].text]
        assert len(pieces) >= 2
        assert chunks[-1].choices[0].finish_reason in ("stop", "length")
        record = next(r for r in sink.records if r.id == chunks[0].id.removeprefix("cmpl-"))
        assert record.outcome == "success" and record.destination == "worker-2"
        assert record.ttft_s is not None and record.ttft_s < record.latency_s
        # llama-cpp-python sends no usage chunk: output tokens are the pieces counted.
        assert record.output_tokens == len(pieces)
        # Not streamed, on the same engine pod: the set runs as completions, joined.
        whole = client.completions.create(model="lm1", prompt="The capital of France is",
                                          max_tokens=8)  # fmt: skip
        assert whole.choices[0].text and sink.records[-1].outcome == "success"
        # A prompt beyond the engine's context (N_CTX tokens): a clean failure, recorded.
        long = "a " * (N_CTX + 100)  # a token a word, within the gateway's character limit
        with pytest.raises(openai.APIStatusError) as failed:
            list(client.completions.create(model="lm1", prompt=long, max_tokens=4, stream=True))
        assert failed.value.status_code in (400, 502), failed.value.message
        assert sink.records[-1].outcome == "failed", sink.records[-1]
    finally:
        srv_a.stop()
        srv_b.stop()
