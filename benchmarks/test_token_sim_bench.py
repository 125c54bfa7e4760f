"""Token-level emulator benchmark (run by `make bench`): `examples/llm-edge`, 200 one-second
slots, RR, no store; the target is under 10 s (scenario load to summary)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from lmedge.bench.runner import RunSpec, run
from lmedge.controller.assembly import PolicyChoice

pytestmark = pytest.mark.bench

LLM_EDGE = Path(__file__).resolve().parents[1] / "examples" / "llm-edge"


def test_llm_edge_200_slots_under_10_s() -> None:
    started = time.perf_counter()
    outcome = run(RunSpec(LLM_EDGE, PolicyChoice("rr"), 1, 200, settle=False))
    wall = time.perf_counter() - started
    print(f"llm-edge rr 200 slots: {wall:.2f} s, {outcome.summary['requests']} requests")
    assert outcome.summary["tokens"]["per_lm"]
    assert wall < 10.0
