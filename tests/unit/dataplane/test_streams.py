"""Streams at the unit level: SSE reading and writing, the pod protocol adapters
(malformed engine output fails cleanly), the streaming clients over
`httpx.MockTransport`, a stream's record, and a stream's place in the queue."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from lmedge.api.inference import Prompt, Sampling
from lmedge.dataplane.clients import HttpClients
from lmedge.dataplane.engines import (
    EngineCall,
    Finish,
    OpenAIProtocol,
    Piece,
    PipelineProtocol,
    PodStreamProtocol,
)
from lmedge.dataplane.queues import LMQueues, LocalModels
from lmedge.dataplane.sse import MalformedStream, SseDecoder, SseEvent, format_event
from lmedge.dataplane.timing import StreamClock, stream_record
from lmedge.dataplane.wire import StreamEnd, StreamForward
from lmedge.errors import BadRequest, ModelFailed, ModelUnavailable, PeerUnavailable

CALL = EngineCall(id="s1", lm="lm1", prompt=Prompt(text="hi"))


def _decode(text: str) -> list[SseEvent]:
    decoder = SseDecoder()
    events = [e for line in text.split("\n") if (e := decoder.line(line.rstrip("\r")))]
    last = decoder.end()
    return [*events, last] if last else events


@pytest.mark.parametrize(
    ("text", "events"),
    [
        ("data: a\n\ndata: b\n\n", [SseEvent("a"), SseEvent("b")]),
        ("data: a\ndata: b\n\n", [SseEvent("a\nb")]),
        (": keep-alive\n\nevent: error\ndata: {}\n\n", [SseEvent("{}", "error")]),
        ("data:x\r\n\r\n", [SseEvent("x")]),
        ("id: 3\nretry: 10\ndata: y\n\n", [SseEvent("y")]),
        ("data: unterminated", [SseEvent("unterminated")]),
    ],
    ids=[
        "two",
        "multi-line",
        "comment-and-named",
        "crlf-no-space",
        "ignored-fields",
        "no-blank-end",
    ],
)
def test_sse_decoding(text: str, events: list[SseEvent]) -> None:
    assert _decode(text) == events


def test_sse_written_events_read_back() -> None:
    data = json.dumps({"a": "line one\nline two"})
    assert _decode(format_event(data).decode()) == [SseEvent(data)]
    assert _decode(format_event("x\ny", "error").decode()) == [SseEvent("x\ny", "error")]


def _read(protocol: PodStreamProtocol, datas: list[str]) -> list[Piece | Finish]:
    reader = protocol.reader()
    out: list[Piece | Finish] = [p for d in datas if (p := reader.event(SseEvent(d)))]
    return [*out, reader.finish()]


def test_pipeline_and_openai_streams_read_the_same() -> None:
    pipeline = _read(PipelineProtocol(), [
        '{"text": "he"}', '{"text": "llo"}',
        '{"done": true, "prompt_tokens": 1, "completion_tokens": 2, "mode": "cpu"}',
    ])  # fmt: skip
    chunk = {"id": "c", "object": "chat.completion.chunk", "choices": []}
    openai = _read(OpenAIProtocol(), [
        json.dumps({**chunk, "choices": [{"index": 0, "delta": {"role": "assistant"}}]}),
        json.dumps({**chunk, "choices": [{"index": 0, "delta": {"content": "he"}}]}),
        json.dumps({**chunk, "choices": [{"index": 0, "delta": {"content": "llo"},
                                          "finish_reason": "length"}]}),
        json.dumps({**chunk, "usage": {"prompt_tokens": 1, "completion_tokens": 2}}),
        "[DONE]",
    ])  # fmt: skip
    assert pipeline[:2] == openai[:2] == [Piece("he"), Piece("llo")]
    assert pipeline[2] == Finish(1, 2, "stop", "cpu")
    assert openai[2] == Finish(1, 2, "length")


@pytest.mark.parametrize(
    ("protocol", "datas", "error", "says"),
    [
        (PipelineProtocol(), ["not json"], MalformedStream, "malformed stream event"),
        (PipelineProtocol(), ['{"text": 3}'], MalformedStream, "malformed"),
        (PipelineProtocol(), ['{"text": "a"}'], MalformedStream, "ended before its last"),
        (PipelineProtocol(), ['{"error": "CUDA OOM"}'], ModelFailed, "CUDA OOM"),
        (OpenAIProtocol(), ["{oops"], MalformedStream, "not JSON"),
        (OpenAIProtocol(), ["[1, 2]"], MalformedStream, "not an object"),
        (OpenAIProtocol(), ['{"id": "x"}'], MalformedStream, "without choices"),
        (OpenAIProtocol(), ['{"choices": [{"delta": {"content": 5}}]}'], MalformedStream,
         "non-text"),
        (OpenAIProtocol(), ['{"choices": []}'], MalformedStream, "before \\[DONE\\]"),
        (OpenAIProtocol(), ['{"error": {"message": "boom"}}'], ModelFailed, "boom"),
        (OpenAIProtocol(), ["[DONE]", '{"choices": []}'], MalformedStream, "after \\[DONE\\]"),
    ],
    ids=["pipeline-not-json", "pipeline-wrong-type", "pipeline-truncated", "pipeline-error",
         "openai-not-json", "openai-not-object", "openai-no-choices", "openai-non-text",
         "openai-truncated", "openai-error", "openai-after-done"],
)  # fmt: skip
def test_malformed_engine_streams_fail_cleanly(
    protocol: PodStreamProtocol, datas: list[str], error: type[Exception], says: str
) -> None:
    with pytest.raises(error, match=says):
        _read(protocol, datas)


def test_openai_request_is_chat_with_messages_else_completion() -> None:
    path, body = OpenAIProtocol().request(
        EngineCall(id="s", lm="lm1", prompt=Prompt(text="hi", max_tokens=5),
                   messages=[{"role": "user", "content": "hi"}])
    )  # fmt: skip
    assert path == "/v1/chat/completions" and body["messages"][0]["content"] == "hi"
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["max_tokens"] == 5
    path, body = OpenAIProtocol().request(CALL)
    assert path == "/v1/completions" and body["prompt"] == "hi" and "max_tokens" not in body


async def _collect(clients: HttpClients, protocol: PodStreamProtocol) -> list[Piece | Finish]:
    return [item async for item in clients.stream_pod("http://pod", protocol, CALL, 5.0)]


def _pod(status: int, body: str) -> HttpClients:
    transport = httpx.MockTransport(lambda r: httpx.Response(status, content=body.encode()))
    return HttpClients(model_transport=transport, peer_transport=transport)


@pytest.mark.parametrize(
    ("status", "body", "error", "says"),
    [
        (200, "data: {bad\n\n", MalformedStream, "malformed"),
        (200, 'data: {"text": "a"}\n\n', MalformedStream, "ended before"),
        (
            422,
            '{"detail": "exceed the model\'s context of 64 tokens"}',
            BadRequest,
            "context of 64",
        ),
        (400, '{"error": {"message": "too long"}}', BadRequest, "too long"),
        (503, "loading", ModelUnavailable, "not ready"),
        (500, "oops", ModelFailed, "500"),
    ],
    ids=["malformed", "truncated", "422-refused", "400-openai-refused", "503-not-ready", "500"],
)
def test_pod_stream_failures(status: int, body: str, error: type[Exception], says: str) -> None:
    with pytest.raises(error, match=says):
        asyncio.run(_collect(_pod(status, body), PipelineProtocol()))


def test_pod_stream_reads_pieces() -> None:
    body = 'data: {"text": "a"}\n\ndata: {"text": "b"}\n\ndata: {"done": true}\n\n'
    assert asyncio.run(_collect(_pod(200, body), PipelineProtocol())) == [
        Piece("a"), Piece("b"), Finish(finish_reason="stop")
    ]  # fmt: skip


@pytest.mark.parametrize(("closes", "served"), [(1, True), (3, False)])
def test_pod_stream_resends_on_a_connection_closed_before_any_answer(
    closes: int, served: bool
) -> None:
    """A pooled keep-alive connection the pod closed as the request went out: the
    request is sent again (up to twice); only a pod that keeps closing fails it."""
    calls = []
    body = 'data: {"text": "a"}\n\ndata: {"done": true}\n\n'

    def handle(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        if len(calls) <= closes:
            raise httpx.RemoteProtocolError("Server disconnected without sending a response.")
        return httpx.Response(200, content=body.encode())

    transport = httpx.MockTransport(handle)
    clients = HttpClients(model_transport=transport, peer_transport=transport)
    if served:
        got = asyncio.run(_collect(clients, PipelineProtocol()))
        assert got == [Piece("a"), Finish(finish_reason="stop")] and len(calls) == 2
    else:
        with pytest.raises(ModelFailed, match="disconnected"):
            asyncio.run(_collect(clients, PipelineProtocol()))
        assert len(calls) == 3


FWD = StreamForward(id="s1", lm="lm1", origin="worker-1", prompt=Prompt(text="x"), sent_at=1.0,
                    budget_s=5)  # fmt: skip


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ('data: {"type": "text", "text": "a"}\n\n', "before its end event"),
        ('data: {"type": "nonsense"}\n\n', "malformed stream event"),
    ],
    ids=["no-end", "malformed"],
)
def test_peer_stream_failures(body: str, says: str) -> None:
    async def run() -> None:
        async for _ in _pod(200, body).forward_stream("http://peer", FWD, 5.0):
            pass

    with pytest.raises(PeerUnavailable, match=says):
        asyncio.run(run())


def test_stream_record_stages_sum_and_token_timing() -> None:
    end = StreamEnd(destination="worker-2", outcome="success", received_at=101.0, queue_s=0.5,
                    prefill_s=1.0, decode_s=3.0, mode="cpu", prompt_tokens=4,
                    completion_tokens=5)  # fmt: skip
    clock = StreamClock(ended=6.0, first=2.6, last=5.8, pieces=3)
    record = stream_record(request_id="s", run="r", lm="lm1", origin="worker-1", slot=0,
                           submit_s=0.0, sent_at=100.0, tau_s=30, clock=clock, end=end,
                           estimated=False)  # fmt: skip
    assert (record.uplink_s, record.queue_s, record.inference_s) == (1.0, 0.5, 4.0)
    assert (record.prefill_s, record.decode_s) == (1.0, 3.0)
    assert record.latency_s == pytest.approx(6.0)
    assert record.ttft_s == 2.6 and record.tpot_s == pytest.approx(3.2 / 4)
    assert (record.input_tokens, record.output_tokens) == (4, 5)  # the engine's, not pieces
    no_usage = end.model_copy(update={"completion_tokens": None})
    counted = stream_record(request_id="s", run="r", lm="lm1", origin="worker-1", slot=0,
                            submit_s=0.0, sent_at=100.0, tau_s=30, clock=clock, end=no_usage,
                            estimated=False)  # fmt: skip
    assert counted.output_tokens == 3  # pieces counted


def test_stream_left_while_queued_gives_up_its_place() -> None:
    async def run() -> list[str]:
        models = LocalModels({"lm1": "http://pod"})
        queues = LMQueues(node="n", models=models, caller=None)  # type: ignore[arg-type]
        order: list[str] = []
        first = await queues.lease(FWD.model_copy(update={"id": "a"}))
        assert first is not None
        waiting = asyncio.ensure_future(queues.lease(FWD.model_copy(update={"id": "b"})))
        third = asyncio.ensure_future(queues.lease(FWD.model_copy(update={"id": "c"})))
        await asyncio.sleep(0.01)
        assert queues.depth() == {"lm1": 2}
        waiting.cancel()  # its client left
        first.release()
        lease = await asyncio.wait_for(third, 5)
        order.append("c" if lease is not None else "none")
        assert not waiting.done() or waiting.cancelled()
        await queues.close()
        return order

    assert asyncio.run(run()) == ["c"]


@pytest.mark.parametrize("concurrency", [1, 3], ids=["pipeline-pod", "engine-of-three"])
def test_a_pod_gets_as_many_streams_at_once_as_it_serves(concurrency: int) -> None:
    """An engine pod registered with concurrency n holds n leases together (it batches
    them); the (n+1)-th waits for one to end. A pipeline pod takes one at a time."""

    async def run() -> tuple[int, bool]:
        models = LocalModels()
        models.replace({"lm1": "http://pod"}, {"lm1": "openai"}, {"lm1": concurrency})
        queues = LMQueues(node="n", models=models, caller=None)  # type: ignore[arg-type]
        ids = [f"s{i}" for i in range(concurrency + 1)]
        waits = [asyncio.ensure_future(queues.lease(FWD.model_copy(update={"id": i}))) for i in ids]
        for _ in range(500):  # until n are granted (5 s at most), then a little longer
            if sum(w.done() for w in waits) >= concurrency:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        held = [w for w in waits if w.done()]
        last_waits = not waits[-1].done()
        for w in held:
            lease = w.result()
            assert lease is not None
            lease.release()
        assert await asyncio.wait_for(waits[-1], 5) is not None
        await queues.close()
        return len(held), last_waits

    assert asyncio.run(run()) == (concurrency, True)


def test_openai_protocol_sends_the_sampling_parameters_under_openai_names() -> None:
    sampling = Sampling(temperature=0.0, seed=3, stop=["\n"], top_p=0.9, frequency_penalty=0.5)
    call = EngineCall(id="s1", lm="lm1", prompt=Prompt(text="hi", max_tokens=5, sampling=sampling))
    path, body = OpenAIProtocol().request(call)
    assert path == "/v1/completions"
    assert body == {
        "model": "lm1", "stream": True, "stream_options": {"include_usage": True},
        "prompt": "hi", "max_tokens": 5, "temperature": 0.0, "seed": 3, "stop": ["\n"],
        "top_p": 0.9, "frequency_penalty": 0.5,
    }  # fmt: skip
    assert "temperature" not in OpenAIProtocol().request(CALL)[1]  # unset: the engine's default
