"""Model routing through real `lmedge gateway` processes and the real `openai` SDK.

examples/model-routing: lm1 (gpt2) and lm2 (gpt2-large) both serve the request
class `text-generation`. worker-1's gateway has no model pods; worker-2's has
stub pods for lm1 and lm2. An OpenAI request for `text-generation` at
worker-1 is served by the (node, LM) the pushed routing map chose
(`Route.model`), as in the emulator; the response names the LM that served it
and the origin's record keeps lm = the class, model = that LM.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from lmedge.store import open_store
from tests.fixtures.dataplane import ServerThread, free_port, model_server

REPO = Path(__file__).resolve().parents[2]
SERVICES = REPO / "examples" / "model-routing" / "services.yaml"
CODE = "import sys; from lmedge.cli import main; main(sys.argv[1:])"
CONTROL = "model-routing-control"
RUN = "model-routing-run"
CLASS = "text-generation"


class Gateway:
    """`lmedge gateway --node NODE` as a child process, ready when /readyz answers."""

    def __init__(
        self, tmp: Path, node: str, port: int, *extra: str, services: Path = SERVICES
    ) -> None:
        self.port, self.store = port, tmp / f"store-{node}"
        token = tmp / "control-token"
        token.write_text(CONTROL)
        self.log = tmp / f"{node}.log"
        args = [
            sys.executable, "-c", CODE, "gateway", "--node", node, "--services", str(services),
            "--port", str(port), "--store", str(self.store), "--run", RUN,
            "--control-token-file", str(token), *extra,
        ]  # fmt: skip
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )  # fmt: skip
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"gateway {node} exited: {self.log.read_text()}")
            try:
                if httpx.get(self.url + "/readyz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"gateway {node} not ready: {self.log.read_text()}")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def push(self, routes: list[dict[str, Any]], slot: int) -> httpx.Response:
        body = {"run": RUN, "slot": slot, "routing": {"routes": routes}}
        headers = {"Authorization": f"Bearer {CONTROL}"}
        return httpx.put(self.url + "/control/routing", json=body, headers=headers, timeout=10)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
        return self.proc.wait(timeout=10)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[Gateway, Gateway, list[ServerThread]]]:
    pods = [model_server(lm, tmp_path, seconds=0.01) for lm in ("lm1", "lm2")]
    p1, p2 = free_port(), free_port()
    peers = [
        "--peer",
        f"worker-1=http://127.0.0.1:{p1}",
        "--peer",
        f"worker-2=http://127.0.0.1:{p2}",
    ]
    models = ["--model-url", f"lm1={pods[0].url}", "--model-url", f"lm2={pods[1].url}"]
    dest = Gateway(tmp_path, "worker-2", p2, *peers, *models)
    origin = Gateway(tmp_path, "worker-1", p1, *peers)
    yield origin, dest, pods
    for gw in (origin, dest):
        gw.stop()
    for pod in pods:
        pod.stop()


def _route(model: str | None) -> dict[str, Any]:
    route = {"origin": "worker-1", "lm": CLASS, "destination": "worker-2"}
    return {**route, "model": model} if model else route


def test_a_request_class_is_served_by_the_model_the_routing_map_chose(
    cluster: tuple[Gateway, Gateway, list[ServerThread]],
) -> None:
    origin, _, _ = cluster
    client = openai.OpenAI(base_url=origin.url + "/v1", api_key="unused", max_retries=0)
    assert CLASS in {m.id for m in client.models.list()}

    def ask() -> Any:
        return client.chat.completions.with_raw_response.create(
            model=CLASS, messages=[{"role": "user", "content": "hello"}], max_tokens=4
        )

    served = []
    for slot, model in enumerate(["lm2", "lm1"], start=1):
        assert origin.push([_route(model)], slot).status_code == 200
        raw = ask()
        chat = raw.parse()
        assert chat.model == model and chat.choices[0].message.content.startswith(f"{model}: ")
        assert raw.headers["x-lmedge-destination"] == "worker-2"
        served.append(model)

    # A map giving the class an LM that does not serve it is refused; the last one stays.
    refused = origin.push([_route("lm4")], 3)
    assert refused.status_code == 404 and "text-generation -> lm4" in refused.text
    assert ask().parse().model == "lm1"
    served.append("lm1")

    # Without a model in the route, the class's first LM (manifest order) serves it.
    assert origin.push([_route(None)], 4).status_code == 200
    assert ask().parse().model == "lm1"
    served.append("lm1")

    # A clean shutdown flushes its records; uvicorn re-raises the SIGTERM it handled.
    assert origin.stop() in (0, -signal.SIGTERM), origin.log.read_text()
    with open_store(str(origin.store), read_only=True) as store:
        records = sorted(store.requests(RUN), key=lambda r: r.slot)
    assert [(r.lm, r.model, r.destination, r.outcome) for r in records] == [
        (CLASS, model, "worker-2", "success") for model in served
    ]
