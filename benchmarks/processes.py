"""`lmedge` commands as child processes for the benchmarks: started, awaited, stopped.

Each gateway or pod runs as its own process, as on a node, so the load
generator in the pytest process does not share its interpreter (nor its GIL).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

__all__ = ["lmedge_process", "stop_processes", "wait_ready"]


def lmedge_process(*args: str, log: Path) -> subprocess.Popen[bytes]:
    """`lmedge ARGS` in its own session (killed as a group), output appended to `log`."""
    code = "import sys; from lmedge.cli import main; main(sys.argv[1:])"
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-c", code, *args],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "LMEDGE_GATEWAY_TOKEN": "", "LMEDGE_CONTROL_TOKEN": ""},
        )  # fmt: skip


def wait_ready(url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    """Return when `url`/readyz answers 200; raise with the log's tail if the process exits."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url} exited: {log.read_text()[-2000:]}")
        try:
            if httpx.get(url + "/readyz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} not ready")


def stop_processes(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM each (last started first: gateways drain and flush), then SIGKILL laggards."""
    for proc in reversed(procs):
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
