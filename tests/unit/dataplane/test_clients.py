"""The httpx clients map transport failures to lmedge errors (MockTransport peers)."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from lmedge.api.inference import InferRequest, InferResult, Prompt
from lmedge.dataplane.clients import HttpClients, PeerUnavailable
from lmedge.dataplane.queues import ModelFailed, ModelUnavailable
from lmedge.dataplane.wire import ForwardRequest

REQ = InferRequest(id="r1", lm="lm1", prompts=[Prompt(text="x")])
FWD = ForwardRequest(id="r1", lm="lm1", origin="worker-1", prompts=[], sent_at=1.0, budget_s=5)


def _clients(handler: httpx.MockTransport) -> HttpClients:
    return HttpClients(token="t", peer_transport=handler, model_transport=handler)


@pytest.mark.parametrize(
    ("status", "error"),
    [(503, ModelUnavailable), (502, ModelUnavailable), (404, ModelFailed), (500, ModelFailed)],
    ids=["503-retry", "502-retry", "404-fail", "500-fail"],
)
def test_model_status_mapping(status: int, error: type[Exception]) -> None:
    clients = _clients(httpx.MockTransport(lambda r: httpx.Response(status, text="no")))
    with pytest.raises(error):
        asyncio.run(clients.infer("http://pod", REQ, 1.0))


def test_model_success_and_connect_error() -> None:
    ok = InferResult(id="r1", lm="lm1", outputs=[], complete=True, inference_s=0.1, mode="cpu")

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.host == "down":
            raise httpx.ConnectError("refused", request=request)
        assert request.url.path == "/infer"
        return httpx.Response(200, content=ok.model_dump_json())

    clients = _clients(httpx.MockTransport(handler))
    assert asyncio.run(clients.infer("http://pod", REQ, 1.0)) == ok
    with pytest.raises(ModelUnavailable, match="ConnectError"):
        asyncio.run(clients.infer("http://down", REQ, 1.0))


def test_forward_sends_control_token_and_maps_failures() -> None:
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers["authorization"])
        return httpx.Response(401, text="missing or wrong bearer token")

    clients = _clients(httpx.MockTransport(handler))
    with pytest.raises(PeerUnavailable, match="answered 401"):
        asyncio.run(clients.forward("http://peer", FWD, 1.0))
    assert seen == ["Bearer t"]
    garbage = _clients(httpx.MockTransport(lambda r: httpx.Response(200, text="{}")))
    with pytest.raises(PeerUnavailable, match="malformed"):
        asyncio.run(garbage.forward("http://peer", FWD, 1.0))


def test_connection_closed_under_request_is_retried() -> None:
    ok = InferResult(id="r1", lm="lm1", outputs=[], complete=True, inference_s=0.1, mode="cpu")
    calls: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        if len(calls) == 1:
            raise httpx.ReadError("connection closed by peer", request=request)
        return httpx.Response(200, content=ok.model_dump_json())

    clients = _clients(httpx.MockTransport(handler))
    assert asyncio.run(clients.infer("http://pod", REQ, 1.0)) == ok
    assert len(calls) == 2
