"""Admission control through real gateways: a refused set is an immediate 429 for the
OpenAI SDK and the native API, and a `rejected` record in the store."""

from __future__ import annotations

from pathlib import Path

import httpx
import openai
import pytest

from lmedge.dataplane.records import StoreSink
from lmedge.store import StoreOptions, open_store
from tests.fixtures.dataplane import TOKEN, control, free_port, gateway, model_server

AUTH = {"Authorization": f"Bearer {TOKEN}"}


def test_rejected_pair_gets_429_with_retry_after_and_a_stored_record(tmp_path: Path) -> None:
    options = StoreOptions(spill_dir=tmp_path / "spill")
    store_dir = tmp_path / "store"
    pods = {lm: model_server(lm, tmp_path, seconds=0.01) for lm in ("lm1", "lm4")}
    port_a, port_b = free_port(), free_port()
    peers = {"worker-1": f"http://127.0.0.1:{port_a}", "worker-2": f"http://127.0.0.1:{port_b}"}
    _, dest = gateway(
        "worker-2", StoreSink(open_store(str(tmp_path / "dest"), options=options)),
        peers=peers, port=port_b, models={lm: s.url for lm, s in pods.items()},
    )  # fmt: skip
    origin_core, origin = gateway(
        "worker-1", StoreSink(open_store(str(store_dir), options=options)), peers=peers,
        port=port_a,
    )  # fmt: skip
    try:
        answer = control(
            origin.url,
            "/control/routing",
            {
                "run": "adm-run",
                "slot": 4,
                "slot_s": 30,
                "routing": {
                    "routes": [{"origin": "worker-1", "lm": "lm1", "destination": "worker-2"}],
                    "rejections": [{"origin": "worker-1", "lm": "lm4"}],
                },
            },
        )
        assert answer == {"routes": 2, "slot": 4}
        assert origin_core.routing.rejected() == ["lm4"]

        client = openai.OpenAI(base_url=origin.url + "/v1", api_key=TOKEN, max_retries=0)
        with pytest.raises(openai.RateLimitError) as info:
            client.images.generate(model="lm4", prompt="a lighthouse at dusk")
        err = info.value
        assert err.status_code == 429
        assert 1 <= int(err.response.headers["retry-after"]) <= 30
        body = err.response.json()
        assert set(body["error"]) == {"message", "type", "code"}
        assert body["error"]["code"] == "rejected" and "admission control" in err.message
        sdk_id = err.response.headers["x-lmedge-request-id"]

        # the native API refuses the same way; an admitted pair is still served
        native = httpx.post(
            origin.url + "/v1/prompt-sets",
            json={"lm": "lm4", "prompts": [{"text": "x"}, {"text": "y"}], "id": "native-1"},
            headers=AUTH,
            timeout=30,
        )
        assert native.status_code == 429 and native.headers["x-lmedge-request-id"] == "native-1"
        assert int(native.headers["retry-after"]) >= 1
        chat = client.chat.completions.create(
            model="lm1", messages=[{"role": "user", "content": "hello"}]
        )
        assert chat.choices[0].message.content
    finally:
        origin.stop()  # closes the sink: the records reach the store
        dest.stop()
        for pod in pods.values():
            pod.stop()
    with open_store(str(store_dir), options=options, read_only=True) as store:
        records = {r.id: r for r in store.requests("adm-run")}
        stats = {s.lm: s for s in store.lm_stats("adm-run")}
    refused = [records[sdk_id], records["native-1"]]
    assert [r.outcome for r in refused] == ["rejected", "rejected"]
    assert all(r.origin == r.destination == "worker-1" and r.slot == 4 for r in refused)
    assert all(r.prompts_done == 0 and r.latency_s == 0.0 and not r.conflict for r in refused)
    assert records["native-1"].prompts == 2
    assert [r.outcome for r in records.values() if r.lm == "lm1"] == ["success"]
    assert (stats["lm4"].arrivals, stats["lm4"].rejected, stats["lm4"].successes) == (2, 2, 0)
    assert stats["lm1"].rejected == 0


def test_the_gateway_process_refuses_and_stores_the_record(tmp_path: Path) -> None:
    """The real `lmedge gateway` process (CLI, uvicorn, embedded store), no slot length pushed."""
    from tests.integration.test_gateway_input import RUN, GatewayProcess

    pod = model_server("lm1", tmp_path)
    process = GatewayProcess(tmp_path, "--model-url", f"lm1={pod.url}")
    try:
        body = {
            "run": RUN,
            "slot": 2,
            "routing": {"routes": [], "rejections": [{"origin": "worker-1", "lm": "lm1"}]},
        }
        assert httpx.put(process.url + "/control/routing", json=body, timeout=10).json() == {
            "routes": 1,
            "slot": 2,
        }
        client = openai.OpenAI(base_url=process.url + "/v1", api_key="unused", max_retries=0)
        with pytest.raises(openai.RateLimitError) as info:
            client.chat.completions.create(
                model="lm1", messages=[{"role": "user", "content": "hi"}]
            )
        retry = int(info.value.response.headers["retry-after"])
        assert 1 <= retry <= 30, "the gateway's default slot: 30 s"
        rid = info.value.response.headers["x-lmedge-request-id"]
    finally:
        process.stop()  # SIGTERM: the gateway drains and closes its store
        pod.stop()
    with open_store(str(process.store), read_only=True) as store:
        (record,) = [r for r in store.requests(RUN) if r.id == rid]
    assert (record.outcome, record.slot, record.origin, record.destination) == (
        "rejected", 2, "worker-1", "worker-1",
    )  # fmt: skip
