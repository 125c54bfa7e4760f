"""The gateway app's answers to oversized images and its start without a user token.

The real app (`create_app`) over a gateway with no model server: every
request here is refused before one would be needed.
"""

from __future__ import annotations

import asyncio
import logging

import httpx
import pytest

from lmedge.api.inference import MAX_IMAGE_CHARS
from lmedge.dataplane.app import ApiSettings, create_app
from lmedge.dataplane.clients import HttpClients
from lmedge.dataplane.gateway import Gateway, GatewaySettings
from lmedge.dataplane.records import MemorySink


def _app(api: ApiSettings | None = None) -> httpx.AsyncClient:
    clients = HttpClients()
    core = Gateway(
        GatewaySettings(node="n1", services={"lm1": "image-to-text"}),
        peers=clients,
        models=clients,
        sink=MemorySink(),
    )
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=create_app(core, api)), base_url="http://gw"
    )


def test_an_oversized_image_is_the_same_422_on_chat_and_native_endpoints() -> None:
    big = "A" * (MAX_IMAGE_CHARS + 1024)  # ~8 MiB + 1 KiB of base64: a "9 MiB" data URL
    chat = {
        "model": "lm1",
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{big}"}}
                ],
            }
        ],
    }
    native = {"lm": "lm1", "prompts": [{"image": big}]}

    async def go() -> list[httpx.Response]:
        async with _app() as http:
            return [
                await http.post("/v1/chat/completions", json=chat),
                await http.post("/v1/prompt-sets", json=native),
            ]

    answers = asyncio.run(go())
    assert [a.status_code for a in answers] == [422, 422]
    assert str(MAX_IMAGE_CHARS) in answers[0].json()["error"]["message"]
    assert "image_url.url" in answers[0].json()["error"]["message"]


@pytest.mark.parametrize(
    ("api", "warned"),
    [(ApiSettings(), True), (ApiSettings(token="user", control_token="control"), False)],
    ids=["open", "with-a-user-token"],
)
def test_a_gateway_without_a_user_token_warns_at_start(
    caplog: pytest.LogCaptureFixture, api: ApiSettings, warned: bool
) -> None:
    with caplog.at_level(logging.WARNING, logger="lmedge.dataplane.app"):
        asyncio.run(_app(api).aclose())
    assert any("no user token" in r.getMessage() for r in caplog.records) is warned
