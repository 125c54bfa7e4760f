"""llama.cpp's own `llama-server`, started and measured for the engine calibration.

`tools/build-llama-server.sh` (part of `make tools`) builds the binary into
`$LMEDGE_TOOLS_DIR/bin/llama-server`. This module starts it on a free
127.0.0.1 port with `--parallel` slots (continuous batching), waits for
`/health`, and streams completions from its native `/completion` endpoint with
the prompt given as token ids (the input length is exact), `n_predict` output
tokens and `ignore_eos` (so is the output length), and prompt caching off
(each request pays its whole prefill, as the emulator assumes). It also reads
the GGUF header for the KV bytes per token.

It does not fit or compare anything (`lmedge.bench.engine_calibration` does),
and it is not the agents' server (`lmedge.agents.local_llm`, llama-cpp-python's,
one request at a time).
"""

from __future__ import annotations

import http.client
import json
import os
import struct
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from lmedge.agents.local_llm import serving
from lmedge.errors import ConfigError

START_TIMEOUT_S = 120.0
#: A stock text whose tokens make the prompts (only its token ids are used).
_VOCAB_TEXT = (
    "The edge cluster serves many language models on small GPUs and CPUs. Requests arrive "
    "in bursts; the control plane routes each prompt to a node, places model replicas, and "
    "keeps the latency of every service within its budget while the network and the nodes "
    "change. Operators read dashboards, tune the policies and compare them on traces."
)


def binary_path() -> Path:
    """Where `make tools` puts llama-server (`$LMEDGE_TOOLS_DIR`, else ./.tools)."""
    tools = os.environ.get("LMEDGE_TOOLS_DIR")
    base = Path(tools) if tools else Path(__file__).resolve().parents[2] / ".tools"
    return base / "bin" / "llama-server"


def missing_reason(binary: Path, model: Path) -> str | None:
    """Why the server cannot start (None when it can)."""
    if not binary.is_file():
        return f"no llama-server at {binary}; run `make tools` (tools/build-llama-server.sh)"
    if not model.is_file():
        return f"no GGUF model at {model}; run `make tools` (tools/build-llama.sh)"
    return None


@dataclass(frozen=True)
class ServerConfig:
    """How the server runs: slots, context per slot, CPU threads."""

    parallel: int = 4
    slot_context: int = 1024
    threads: int = 2
    #: 0: threads sleep between graph nodes instead of spinning; on a shared
    #: machine a spinning thread that lost its core stalls every barrier.
    poll: int = 0
    #: Serve `/metrics` (what the node agent's engine telemetry reads).
    metrics: bool = False

    def argv(self, binary: Path, model: Path, port: int) -> list[str]:
        return [
            str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
            "--parallel", str(self.parallel), "--ctx-size", str(self.parallel * self.slot_context),
            "--threads", str(self.threads), "--threads-batch", str(self.threads),
            "--poll", str(self.poll), "--cont-batching", "--no-webui", "--cache-ram", "0",
            *(["--metrics"] if self.metrics else []),
        ]  # fmt: skip


@dataclass(frozen=True)
class Completion:
    """One streamed completion as the client saw it (monotonic seconds)."""

    sent_s: float
    first_s: float
    last_s: float
    tokens: int
    prompt_tokens: int
    server_prompt_per_s: float


class LlamaServer:
    """A running llama-server: its base URL; requests are blocking (run them in threads)."""

    def __init__(self, port: int, log_path: Path) -> None:
        self.port = port
        self.log_path = log_path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _post(self, path: str, body: dict[str, Any]) -> Any:
        req = urllib.request.Request(
            self.url + path,
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=60) as resp:
            return json.loads(resp.read())

    def vocabulary(self) -> list[int]:
        """Distinct token ids of ordinary words, to draw prompts from."""
        tokens = self._post("/tokenize", {"content": _VOCAB_TEXT})["tokens"]
        return sorted({int(t) for t in tokens})

    def complete(self, prompt: Sequence[int], n_predict: int, timeout_s: float = 600) -> Completion:
        """Stream one completion of exactly `n_predict` tokens for the token-id `prompt`."""
        body = json.dumps(
            {
                "prompt": list(prompt),
                "n_predict": n_predict,
                "ignore_eos": True,
                "cache_prompt": False,
                "stream": True,
                "temperature": 0.0,
                "top_k": 1,
            }
        ).encode()
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout_s)
        try:
            sent = time.monotonic()
            conn.request("POST", "/completion", body, {"Content-Type": "application/json"})
            resp = conn.getresponse()
            if resp.status != 200:
                raise RuntimeError(f"llama-server answered {resp.status}: {resp.read()[:300]!r}")
            first = last = 0.0
            chunks = 0
            final: dict[str, Any] = {}
            for raw in resp:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                now = time.monotonic()
                event = json.loads(line[5:])
                chunks += 1
                if chunks == 1:
                    first = now
                last = now
                if event.get("stop"):  # sent with (or right after) the last token
                    final = event
                    break
        finally:
            conn.close()
        timings = final.get("timings", {})
        tokens = int(timings.get("predicted_n", chunks))
        return Completion(
            sent_s=sent,
            first_s=first,
            last_s=last,
            tokens=tokens,
            prompt_tokens=int(timings.get("prompt_n", len(prompt))),
            server_prompt_per_s=float(timings.get("prompt_per_second", 0.0)),
        )


@contextmanager
def running_llama_server(
    binary: Path, model: Path, config: ServerConfig, log_path: Path, port: int
) -> Iterator[LlamaServer]:
    """Start llama-server, wait until `/health` answers, always stop it after.

    `ConfigError` when the binary or the model is missing; `RuntimeError`
    with the log's tail when the server dies or is not ready in time.
    """
    if why := missing_reason(binary, model):
        raise ConfigError(why)
    server = LlamaServer(port, log_path)
    argv = config.argv(binary, model, port)
    with serving(argv, log_path, f"{server.url}/health", START_TIMEOUT_S):
        yield server


# -- the GGUF header ----------------------------------------------------------------

_SCALARS = {
    0: "B",
    1: "b",
    2: "H",
    3: "h",
    4: "I",
    5: "i",
    6: "f",
    7: "?",
    10: "Q",
    11: "q",
    12: "d",
}
_STRING, _ARRAY = 8, 9


def _read(f: BinaryIO, fmt: str) -> Any:
    size = struct.calcsize("<" + fmt)
    return struct.unpack("<" + fmt, f.read(size))[0]


def _value(f: BinaryIO, kind: int) -> Any:
    if kind == _STRING:
        return f.read(_read(f, "Q")).decode("utf-8", errors="replace")
    if kind == _ARRAY:
        item, n = _read(f, "I"), _read(f, "Q")
        return [_value(f, item) for _ in range(n)]
    return _read(f, _SCALARS[kind])


def gguf_metadata(path: Path, wanted: Sequence[str]) -> dict[str, Any]:
    """The `wanted` scalar keys of a GGUF file's header (v2/v3), read until all are found."""
    found: dict[str, Any] = {}
    with path.open("rb") as f:
        if f.read(4) != b"GGUF":
            raise ConfigError(f"{path} is not a GGUF file")
        _read(f, "I")  # version
        _read(f, "Q")  # tensor count
        for _ in range(_read(f, "Q")):
            key = f.read(_read(f, "Q")).decode()
            value = _value(f, _read(f, "I"))
            if key in wanted:
                found[key] = value
                if len(found) == len(wanted):
                    break
    return found


def kv_bytes_per_token(model: Path, bytes_per_value: int = 2) -> int:
    """2 (K and V) x layers x (key + value length) / 2 x KV heads x bytes (f16 cache).

    Sliding-window layers are counted in full: an upper bound, the KV a
    sequence of the window's length or more holds on every layer.
    """
    arch = gguf_metadata(model, ["general.architecture"])["general.architecture"]
    keys = [
        f"{arch}.block_count",
        f"{arch}.attention.head_count_kv",
        f"{arch}.attention.key_length",
        f"{arch}.attention.value_length",
    ]
    meta = gguf_metadata(model, keys)
    if len(meta) != len(keys):
        raise ConfigError(f"{model} lacks {sorted(set(keys) - set(meta))} in its header")
    layers, heads = int(meta[keys[0]]), int(meta[keys[1]])
    k_len, v_len = int(meta[keys[2]]), int(meta[keys[3]])
    return layers * heads * (k_len + v_len) * bytes_per_value
