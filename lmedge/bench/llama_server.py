"""llama.cpp's own `llama-server`, started and measured for the engine calibration.

`tools/build-llama-server.sh` (part of `make tools`) builds the binary into
`$LMEDGE_TOOLS_DIR/bin/llama-server`. This module starts it on a free
127.0.0.1 port (`ServerConfig.argv` says which flags and why), waits for
`/health`, and streams completions from its native `/completion` endpoint
with the prompt given as token ids (the input length is exact), `n_predict`
output tokens and `ignore_eos` (so is the output length), and prompt caching
off (each request pays its whole prefill, as the emulator assumes). The
client is one asyncio loop (`LlamaServer.run`): each request is sent at its
planned time and timed at its send, its admission (llama-server sends the
response headers when a slot starts the prompt), its first and its last
token, on the wall clock or on the server's own (`ServerClock`). It also
reads the GGUF header for the KV bytes per token.

It does not fit or compare anything (`lmedge.bench.engine_calibration` does),
and it is not the agents' server (`lmedge.agents.local_llm`, llama-cpp-python's,
one request at a time).
"""

from __future__ import annotations

import asyncio
import json
import os
import struct
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Literal

import httpx

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


#: How the calibration times the server: "wall", seconds of the machine's clock;
#: "cpu", the server's own progress (`ServerClock`).
ClockKind = Literal["wall", "cpu"]
CLOCKS: tuple[ClockKind, ...] = ("wall", "cpu")


@dataclass(frozen=True)
class ServerConfig:
    """How the server runs: slots, context per slot, CPU threads.

    `threads` is passed as both `--threads` (decode) and `--threads-batch`
    (prompt processing): the same cores do both, as the emulator assumes one
    speed per instance. On a machine that also runs the client (and other
    work), one thread is the robust choice: with two, every graph node ends
    at a barrier, and a thread that lost its core to another process stalls
    the other (measured here under load: 50-100x slower, where one thread
    slowed in proportion to its share of a core).
    """

    parallel: int = 4
    slot_context: int = 1024
    threads: int = 1
    #: 0: threads sleep between graph nodes instead of spinning; on a shared
    #: machine a spinning thread that lost its core stalls every barrier.
    poll: int = 0
    #: Serve `/metrics` (what the node agent's engine telemetry reads).
    metrics: bool = False

    def argv(self, binary: Path, model: Path, port: int) -> list[str]:
        """The command line. Besides the slots and threads: continuous batching on;
        no prompt cache (`--cache-ram 0`, and each request sends `cache_prompt:
        false`), so every request pays its whole prefill; no context checkpoints
        (`--ctx-checkpoints 0`): for a sliding-window model (Gemma 3) llama-server
        otherwise stops each prompt 4 (and 516) tokens before its end, to
        snapshot the window's KV, and prefills the rest in a later iteration, so
        one prompt takes two or three iterations, a cost only worth paying when
        the snapshot is reused (prompt caching, which the calibration turns off);
        a unified KV cache (`--kv-unified`): with one cache per slot, llama.cpp
        splits each batch into "equal" ubatches (the same number of tokens from
        each of a run of consecutive slots), so a new prompt beside running
        sequences, or two running slots that are not neighbours, cost two or more
        forward passes (measured: 2 sequences decode at 60 or 87 ms an iteration
        depending on their slots); unified, a batch is one forward pass per 512
        tokens, the emulator's iteration."""
        return [
            str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
            "--parallel", str(self.parallel), "--ctx-size", str(self.parallel * self.slot_context),
            "--threads", str(self.threads), "--threads-batch", str(self.threads),
            "--poll", str(self.poll), "--cont-batching", "--no-webui", "--cache-ram", "0",
            "--ctx-checkpoints", "0", "--kv-unified",
            *(["--metrics"] if self.metrics else []),
        ]  # fmt: skip


class ServerClock:
    """The calibration's clock, seconds: the machine's, or the server's own progress.

    `pid` None: `time.monotonic()`. Otherwise a clock that advances, while at
    least one request is in flight, by the CPU time of the server's main
    thread (`/proc/PID/task/PID/schedstat`: the thread that runs the model
    when `--threads 1`), and by wall time while none is. A server that waits
    for a core held by another process does not advance it, so its latencies
    are the ones it would have on a core of its own: a measurement on a
    shared machine, where the wall clock measures the other processes' load.
    What it leaves out: the client's and the HTTP threads' time (they run
    beside the model's thread when a second core is free), and the cache and
    memory-bandwidth contention of the neighbours, which still slow it.
    """

    def __init__(self, pid: int | None = None) -> None:
        self._stat = f"/proc/{pid}/task/{pid}/schedstat" if pid is not None else None
        self._in_flight = 0
        self._wall = time.monotonic()
        self._cpu = self._cpu_s()
        self._now = self._wall

    def _cpu_s(self) -> float:
        if self._stat is None:
            return 0.0
        with open(self._stat) as f:
            return int(f.read().split()[0]) / 1e9

    def now(self) -> float:
        wall = time.monotonic()
        if self._stat is None:
            return wall
        cpu = self._cpu_s()
        self._now += cpu - self._cpu if self._in_flight else wall - self._wall
        self._wall, self._cpu = wall, cpu
        return self._now

    def started(self) -> float:
        """A request is sent now (the server has work from now on); the time."""
        t = self.now()
        self._in_flight += 1
        return t

    def finished(self) -> float:
        """A request's last event arrived now; the time."""
        t = self.now()
        self._in_flight -= 1
        return t


def server_clock(kind: ClockKind, pid: int) -> ServerClock:
    """The clock `kind` for the server process `pid` (ConfigError where "cpu" cannot be read)."""
    if kind == "wall":
        return ServerClock()
    if not Path(f"/proc/{pid}/task/{pid}/schedstat").is_file():
        raise ConfigError(
            "--clock cpu reads the server thread's CPU time from /proc/PID/task/PID/schedstat, "
            "which this system lacks; use --clock wall on a machine of its own"
        )
    return ServerClock(pid)


@dataclass(frozen=True)
class Completion:
    """One streamed completion as the client saw it (the clock's seconds), and the server's timings.

    `admitted_s` is when the response headers arrived: llama-server sends them
    when a slot starts the request's prompt (until then the request waits for
    a free slot or for the iteration under way), so `admitted_s - sent_s` is
    the wait and `first_s - admitted_s` the prefill as the client sees it.
    """

    planned_s: float
    sent_s: float
    admitted_s: float
    first_s: float
    last_s: float
    tokens: int
    prompt_tokens: int
    #: The server's own prompt and generation times (`timings.prompt_ms`, `predicted_ms`), s.
    server_prompt_s: float
    server_decode_s: float


@dataclass(frozen=True)
class Call:
    """A completion to stream: sent `offset_s` after the start, `n_predict` tokens for `prompt`."""

    offset_s: float
    prompt: Sequence[int]
    n_predict: int


def _body(prompt: Sequence[int], n_predict: int) -> dict[str, Any]:
    return {
        "prompt": list(prompt),
        "n_predict": n_predict,
        "ignore_eos": True,
        "cache_prompt": False,
        "stream": True,
        "temperature": 0.0,
        "top_k": 1,
    }


class LlamaServer:
    """A running llama-server: its base URL, and an asyncio client that streams completions."""

    def __init__(self, port: int, log_path: Path, clock: ServerClock | None = None) -> None:
        self.port = port
        self.log_path = log_path
        self.clock = clock or ServerClock()

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

    def run(self, calls: Sequence[Call], timeout_s: float = 600) -> list[Completion]:
        """Stream every call's completion, each sent at its offset (s, on `clock`) from now.

        Results in call order. One thread, one asyncio loop, one connection
        per request: a request waiting for its time costs nothing, so sends
        keep to the plan however many are in flight (one thread per request,
        sharing the cores with the server, started them late and out of order).
        """
        return asyncio.run(self._run(calls, timeout_s))

    async def _run(self, calls: Sequence[Call], timeout_s: float) -> list[Completion]:
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)
        async with httpx.AsyncClient(base_url=self.url, timeout=timeout_s, limits=limits) as client:
            t0 = self.clock.now() + 0.2
            done = await asyncio.gather(
                *(self._complete(client, t0 + c.offset_s, c.prompt, c.n_predict) for c in calls)
            )
        return list(done)

    async def _complete(
        self, client: httpx.AsyncClient, planned: float, prompt: Sequence[int], n_predict: int
    ) -> Completion:
        # The clock may run slower than the wall (cpu: a loaded server): sleep
        # what is left and look again, never past the planned time.
        while (left := planned - self.clock.now()) > 0:
            await asyncio.sleep(max(left, 5e-4))
        sent = self.clock.started()
        first = last = 0.0
        chunks = 0
        final: dict[str, Any] = {}
        try:
            async with client.stream("POST", "/completion", json=_body(prompt, n_predict)) as resp:
                admitted = self.clock.now()
                if resp.status_code != 200:
                    body = (await resp.aread())[:300]
                    raise RuntimeError(f"llama-server answered {resp.status_code}: {body!r}")
                async for line in resp.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    now = self.clock.now()
                    event = json.loads(line[5:])
                    chunks += 1
                    if chunks == 1:
                        first = now
                    last = now
                    if event.get("stop"):  # sent with (or right after) the last token
                        final = event
                        break
        finally:
            self.clock.finished()
        timings = final.get("timings", {})
        return Completion(
            planned_s=planned,
            sent_s=sent,
            admitted_s=admitted,
            first_s=first,
            last_s=last,
            tokens=int(timings.get("predicted_n", chunks)),
            prompt_tokens=int(timings.get("prompt_n", len(prompt))),
            server_prompt_s=float(timings.get("prompt_ms", 0.0)) / 1e3,
            server_decode_s=float(timings.get("predicted_ms", 0.0)) / 1e3,
        )

    def complete(self, prompt: Sequence[int], n_predict: int) -> Completion:
        """One completion of exactly `n_predict` tokens for the token-id `prompt`, alone."""
        return self.run([Call(0.0, prompt, n_predict)])[0]


@contextmanager
def running_llama_server(
    binary: Path,
    model: Path,
    config: ServerConfig,
    log_path: Path,
    port: int,
    clock: ClockKind = "wall",
) -> Iterator[LlamaServer]:
    """Start llama-server, wait until `/health` answers, always stop it after.

    `ConfigError` when the binary or the model is missing, or the clock
    cannot be read; `RuntimeError` with the log's tail when the server dies
    or is not ready in time.
    """
    if why := missing_reason(binary, model):
        raise ConfigError(why)
    if clock == "cpu" and config.threads != 1:
        raise ConfigError(
            f"--clock cpu times the server's one model thread; --threads must be 1, "
            f"got {config.threads}"
        )
    argv = config.argv(binary, model, port)
    url = f"http://127.0.0.1:{port}"
    with serving(argv, log_path, f"{url}/health", START_TIMEOUT_S) as proc:
        yield LlamaServer(port, log_path, server_clock(clock, proc.pid))


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
