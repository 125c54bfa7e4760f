"""Bad input to the real `lmedge gateway` process, and its shutdown.

The gateway runs as a child process (the CLI, uvicorn, the embedded store)
in front of a stub model server for lm1; lm2 has no pod. Each test sends what
a careless or hostile client sends and checks the answer a client of the
OpenAI API expects: 400 for a body that is not valid JSON or not valid
Unicode, 413 for a body over the limit however it is framed, and `usage`
counted by the model server. A port the gateway cannot use is one error line
and exit 2; after SIGTERM, a set waiting for an LM with no pod is answered and
recorded within the drain period, and the process exits.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
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
SERVICES = REPO / "examples" / "testbed" / "services.yaml"
CODE = "import sys; from lmedge.cli import main; main(sys.argv[1:])"
MAX_BODY = 64 * 1024
RUN = "gw-input"
JSON = {"Content-Type": "application/json"}


def _gateway_args(port: int | str, store: Path, *extra: str) -> list[str]:
    return [
        sys.executable, "-c", CODE, "gateway", "--node", "worker-1",
        "--services", str(SERVICES), "--port", str(port), "--store", str(store),
        "--run", RUN, "--max-body-bytes", str(MAX_BODY), *extra,
    ]  # fmt: skip


class GatewayProcess:
    """`lmedge gateway` as a child process, ready when /readyz answers."""

    def __init__(self, tmp: Path, *extra: str) -> None:
        self.port = free_port()
        self.store = tmp / "store"
        self.log = tmp / f"gateway-{self.port}.log"
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                _gateway_args(self.port, self.store, *extra),
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )  # fmt: skip
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"gateway exited: {self.log.read_text()}")
            try:
                if httpx.get(self.url + "/readyz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"gateway not ready: {self.log.read_text()}")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)


@pytest.fixture(scope="module")
def lm1(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    pod = model_server("lm1", tmp_path_factory.mktemp("pods"))
    yield pod
    pod.stop()


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, lm1: ServerThread) -> Iterator[GatewayProcess]:
    process = GatewayProcess(tmp_path_factory.mktemp("gateway"), "--model-url", f"lm1={lm1.url}")
    yield process
    process.stop()


def _post(gw: GatewayProcess, path: str, content: Any, **kw: Any) -> httpx.Response:
    return httpx.post(gw.url + path, content=content, headers=JSON, timeout=30, **kw)


def _message(response: httpx.Response) -> str:
    error = response.json()["error"]
    assert set(error) == {"message", "type", "code"}, error
    return str(error["message"])


# -- Unicode ---------------------------------------------------------------------

LONE = [
    ("chat-high", "/v1/chat/completions",
     b'{"model": "lm1", "messages": [{"role": "user", "content": "hi \\ud800"}]}'),
    ("chat-low", "/v1/chat/completions",
     b'{"model": "lm1", "messages": [{"role": "user", "content": "\\udfff"}]}'),
    ("completions", "/v1/completions", b'{"model": "lm1", "prompt": ["ok", "\\uDBFF x"]}'),
    ("prompt-sets", "/v1/prompt-sets", b'{"lm": "lm1", "prompts": [{"text": "\\ud83d"}]}'),
    ("in-a-key", "/v1/prompt-sets", b'{"lm": "lm1", "\\ud800": 1, "prompts": [{"text": "x"}]}'),
]  # fmt: skip


@pytest.mark.parametrize(("path", "body"), [c[1:] for c in LONE], ids=[c[0] for c in LONE])
def test_lone_surrogate_is_a_bad_request(gw: GatewayProcess, path: str, body: bytes) -> None:
    response = _post(gw, path, body)
    assert response.status_code == 400, response.text
    assert "lone UTF-16 surrogate" in _message(response)


NON_FINITE = [
    ("chat-max-tokens", "/v1/chat/completions",
     b'{"model": "lm1", "messages": [{"role": "user", "content": "x"}], "max_tokens": NaN}'),
    # An infinite budget would keep the set queued forever: it passes `budget_s > 0`.
    ("forward-budget", "/internal/forward",
     b'{"id": "f-1", "lm": "lm2", "origin": "worker-2", "prompts": [{"text": "x"}], '
     b'"sent_at": 1.0, "budget_s": Infinity}'),
    ("prompt-sets-negative", "/v1/prompt-sets",
     b'{"lm": "lm1", "prompts": [{"text": "x", "max_tokens": -Infinity}]}'),
]  # fmt: skip


@pytest.mark.parametrize(
    ("path", "body"), [c[1:] for c in NON_FINITE], ids=[c[0] for c in NON_FINITE]
)
def test_nan_and_infinity_are_not_json_numbers(gw: GatewayProcess, path: str, body: bytes) -> None:
    response = _post(gw, path, body)
    assert response.status_code == 400, response.text
    assert "which is not a JSON number" in _message(response)


def test_the_words_nan_and_infinity_in_text_are_fine(gw: GatewayProcess) -> None:
    body = b'{"lm": "lm1", "prompts": [{"text": "NaN and Infinity, as words"}]}'
    response = _post(gw, "/v1/prompt-sets", body)
    assert response.status_code == 200, response.text


def test_paired_surrogates_are_text(gw: GatewayProcess) -> None:
    # How json.dumps (and so the OpenAI SDK) escapes an emoji: a valid pair.
    body = b'{"model": "lm1", "messages": [{"role": "user", "content": "hi \\ud83d\\ude00"}]}'
    response = _post(gw, "/v1/chat/completions", body)
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"].startswith("lm1: ")


def test_model_server_refuses_a_lone_surrogate_with_422(lm1: ServerThread) -> None:
    # The model pod's own API, called directly: pydantic refuses the text, and the
    # 422 must not echo it back (FastAPI's default handler did: a 500).
    body = b'{"id": "s-1", "lm": "lm1", "prompts": [{"text": "a \\udc00 b"}]}'
    response = httpx.post(lm1.url + "/infer", content=body, headers=JSON, timeout=30)
    assert response.status_code == 422, response.text
    [error] = response.json()["detail"]
    assert error["loc"] == ["body", "prompts", 0, "text"]
    assert "input" not in error


# -- JSON and size ---------------------------------------------------------------

NOT_JSON = [
    ("truncated", b'{"model": "lm1", "messages": ['),
    ("trailing-comma", b'{"model": "lm1",}'),
    ("bare-word", b"hello"),
    ("invalid-utf8", b'{"model": "lm1", "prompt": "\xff\xfe"}'),
]


@pytest.mark.parametrize("body", [c[1] for c in NOT_JSON], ids=[c[0] for c in NOT_JSON])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/v1/prompt-sets"])
def test_invalid_json_is_400_as_openai_answers(gw: GatewayProcess, path: str, body: bytes) -> None:
    response = _post(gw, path, body)
    assert response.status_code == 400, response.text
    _message(response)


def test_chunked_body_over_the_limit_is_413(gw: GatewayProcess) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"lm": "lm1", "prompts": [{"text": "'
        for _ in range(2 * MAX_BODY // 1024):
            yield b"x" * 1024
        yield b'"}]}'

    # A generator body has no Content-Length: httpx sends it chunked.
    response = httpx.post(gw.url + "/v1/prompt-sets", content=chunks(), headers=JSON, timeout=30)
    assert response.status_code == 413, response.text
    assert f"larger than {MAX_BODY} bytes" in _message(response)


def test_chunked_body_within_the_limit_is_served(gw: GatewayProcess) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"lm": "lm1", "prompts": '
        yield b'[{"text": "a"}, {"text": "b"}]}'

    response = httpx.post(gw.url + "/v1/prompt-sets", content=chunks(), headers=JSON, timeout=30)
    assert response.status_code == 200, response.text
    assert response.json()["prompts_done"] == 2


# -- completions and usage -------------------------------------------------------


@pytest.mark.parametrize("length", [65, 1000, 32_768])
def test_completion_string_prompt_is_not_capped_at_64_characters(
    gw: GatewayProcess, length: int
) -> None:
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key="unused", max_retries=0)
    completion = client.completions.create(model="lm1", prompt="y" * length, max_tokens=4)
    assert len(completion.choices) == 1


def test_completion_string_prompt_beyond_the_text_limit_is_refused(gw: GatewayProcess) -> None:
    body = {"model": "lm1", "prompt": "y" * 32_769}
    response = httpx.post(gw.url + "/v1/completions", json=body, timeout=30)
    assert response.status_code == 400, response.text
    assert "longer than 32768 characters" in _message(response)


def test_completion_list_keeps_its_64_item_bound(gw: GatewayProcess) -> None:
    body = {"model": "lm1", "prompt": ["a"] * 65}
    response = httpx.post(gw.url + "/v1/completions", json=body, timeout=30)
    assert response.status_code == 400, response.text
    assert "prompt lists 65 prompts; at most 64 per request" in _message(response)


def test_usage_counts_what_the_model_server_reports(gw: GatewayProcess) -> None:
    # The stub model server counts whitespace-separated words as tokens, and
    # answers "lm1: <digest>" (2 tokens) per prompt.
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key="unused", max_retries=0)
    chat = client.chat.completions.create(
        model="lm1", messages=[{"role": "user", "content": "say hi there"}], n=2
    )
    assert chat.usage is not None
    assert (chat.usage.prompt_tokens, chat.usage.completion_tokens) == (6, 4)
    assert chat.usage.total_tokens == 10

    completion = client.completions.create(model="lm1", prompt=["one", "two words", "a b c"])
    assert completion.usage is not None
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (6, 6)


# -- start-up: the port ----------------------------------------------------------


def _start_fails(tmp_path: Path, port: int | str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        _gateway_args(port, tmp_path / "store", *extra),
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


@pytest.mark.parametrize("port", [99999, 65536, 0, -1], ids=str)
def test_port_out_of_range_is_one_error_line(tmp_path: Path, port: int) -> None:
    done = _start_fails(tmp_path, port)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines == [f"error: --port must be between 1 and 65535, got {port}"]


def test_port_in_use_is_one_error_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = _start_fails(tmp_path, port)
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert line.startswith(f"error: cannot listen on 127.0.0.1:{port}: ")


def test_negative_drain_is_refused(tmp_path: Path) -> None:
    done = _start_fails(tmp_path, free_port(), "--drain-s", "-1")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == ["error: --drain-s must be >= 0 and finite, got -1"]


# -- shutdown --------------------------------------------------------------------

DRAIN_S = 2.0


def test_sigterm_answers_and_records_a_waiting_set_within_the_drain(tmp_path: Path) -> None:
    # lm2 has no pod here: its set would wait for one until tau (900 s).
    process = GatewayProcess(tmp_path, "--drain-s", str(DRAIN_S))
    answer: dict[str, httpx.Response] = {}

    def submit() -> None:
        body = {"lm": "lm2", "id": "waits-1", "prompts": [{"text": "hello"}]}
        answer["r"] = httpx.post(process.url + "/v1/prompt-sets", json=body, timeout=120)

    client = threading.Thread(target=submit)
    client.start()
    try:
        deadline = time.monotonic() + 30
        while "lm2" not in httpx.get(process.url + "/control/status").json()["queue_depth"]:
            assert time.monotonic() < deadline, "the set never reached lm2's queue"
            time.sleep(0.05)
        stopped = time.monotonic()
        process.proc.send_signal(signal.SIGTERM)
        code = process.proc.wait(timeout=60)
        took = time.monotonic() - stopped
    finally:
        client.join(timeout=60)
        process.stop()
    # uvicorn re-raises the SIGTERM it handled once it has shut down cleanly.
    assert code in (0, -signal.SIGTERM), process.log.read_text()
    # Within the drain plus the store flush; 900 s before the fix.
    assert DRAIN_S <= took < 45, took
    # The native API answers every outcome in its body.
    result = answer["r"].json()
    assert (result["outcome"], result["error"]) == ("timeout", "gateway shutting down")
    with open_store(str(process.store), read_only=True) as store:
        [record] = list(store.requests(RUN))
    assert (record.id, record.lm, record.outcome) == ("waits-1", "lm2", "timeout")
    assert record.error == "gateway shutting down"
