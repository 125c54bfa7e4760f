"""The one-command self-hosted run's `lmedge simulate` line, end to end (lmedge.agents.local_llm).

`make simulate-llm` starts the bundled llama-cpp-python server and runs the
command line `simulate_argv` builds. Here that exact line runs as the real
`lmedge` console script against the suite's OpenAI-compatible test server
(answering every agent with a sensible decision), so the options, the
per-tier parameters (budgets lifted off the slot) and the policy are proven
to be what the CLI and the agentic plugins accept, in seconds rather than
the minutes a CPU-hosted model takes per call. The bundled server itself
starts through the same module in the llama-server fixture
(tests/integration/test_agents_llama.py, benchmarks/test_agents_bench.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from lmedge.agents.local_llm import simulate_argv
from tests.fixtures.llm_server import running_server

LMEDGE = str(Path(sys.executable).with_name("lmedge"))


def test_the_one_command_line_runs_ma_on_the_endpoint(tmp_path: Path) -> None:
    with running_server() as server:
        argv = simulate_argv(
            server.base_url, ["--slots", "2", "--no-settle", "--no-store", "--json"], LMEDGE
        )
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=300, check=False, cwd=tmp_path
        )
        served = list(server.served)
        bodies = [json.loads(b) for b in server.bodies]
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads(done.stdout)
    assert summary["policy"] == "ma"
    # Slot 0 plans (planner), and each slot routes (scheduler) and places on the
    # six workers (deployers): every agent asked the endpoint.
    assert len(served) >= 1 + 2 * (1 + 6)
    assert all(b["model"] == "gemma3-270m" for b in bodies)
    assert all(b.get("max_tokens") for b in bodies)  # bounded generations
