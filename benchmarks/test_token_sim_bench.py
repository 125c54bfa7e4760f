"""Token-level emulator benchmark (run by `make bench`).

* `examples/llm-edge`, 200 one-second slots, `ll`, no store: the target is
  under 10 s (scenario load to summary), the only assertion here.
* Events per second and wall time per slot for llm-edge and for a 1,000-node
  variant of it (its eight workers copied 125 times, the same two engine
  LMs; every worker is an origin, so the load grows with the capacity):
  engine steps (prefill or decode spans of `BatchingEngine`) and SimPy
  events, counted by wrapping `BatchingEngine._end_step` and
  `simpy.Environment.step` for the run (the wrappers' own cost is in the
  wall time).
* The cost of one engine step against the sequences running in it:
  `BatchingEngine` alone, kept full at N running sequences.

LMEDGE_TOKEN_SIM_SLOTS (default 5) sets the 1,000-node variant's slots.
Timings on a shared, loaded machine: read them as upper bounds.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import simpy
import yaml

from lmedge.api.engines import DecodePoint, ThroughputProfile
from lmedge.bench.runner import RunSpec, run
from lmedge.controller.assembly import PolicyChoice
from lmedge.sim.tokens.batching import BatchingEngine, TokenRequest

pytestmark = pytest.mark.bench

LLM_EDGE = Path(__file__).resolve().parents[1] / "examples" / "llm-edge"
TARGET_S = 10.0
#: Least-loaded routing: the engines serve (under `rr`, random deployment, nothing is
#: served on llm-edge and the emulator has no token work to do).
POLICY = "ll"
ROWS: list[dict[str, Any]] = []


def _counted_run(spec: RunSpec, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Run `spec`, counting engine steps and SimPy events; wall time and the counts."""
    counts = {"steps": 0, "events": 0}

    def counting(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            counts[name] += 1
            return original(*args, **kwargs)

        return wrapper

    monkeypatch.setattr(BatchingEngine, "_end_step", counting("steps", BatchingEngine._end_step))
    monkeypatch.setattr(simpy.Environment, "step", counting("events", simpy.Environment.step))
    started = time.perf_counter()
    outcome = run(spec)
    wall = time.perf_counter() - started
    monkeypatch.undo()
    slots = spec.slots or 1
    return {
        "slots": slots,
        "wall_s": round(wall, 2),
        "ms_per_slot": round(1e3 * wall / slots, 1),
        "requests": outcome.summary["requests"],
        "engine_steps": counts["steps"],
        "simpy_events": counts["events"],
        "steps_per_s": round(counts["steps"] / wall),
        "events_per_s": round(counts["events"] / wall),
        "summary": outcome.summary,
    }


def _print(row: dict[str, Any]) -> None:
    print(
        f"{row['scenario']:16} {row['slots']:>5} {row['wall_s']:>7} {row['ms_per_slot']:>8} "
        f"{row['requests']:>8} {row['engine_steps']:>9} {row['steps_per_s']:>9} "
        f"{row['simpy_events']:>9} {row['events_per_s']:>9}"
    )


HEADER = (
    f"\n{'scenario':16} {'slots':>5} {'wall s':>7} {'ms/slot':>8} {'requests':>8} "
    f"{'eng steps':>9} {'steps/s':>9} {'simpy ev':>9} {'events/s':>9}"
)


def test_llm_edge_200_slots_under_10_s(monkeypatch: pytest.MonkeyPatch) -> None:
    row = {"scenario": "llm-edge"} | _counted_run(
        RunSpec(LLM_EDGE, PolicyChoice(POLICY), 1, 200, settle=False), monkeypatch
    )
    print(HEADER)
    _print(row)
    ROWS.append(row)
    assert row["summary"]["tokens"]["per_lm"]
    assert row["wall_s"] < TARGET_S


def _thousand_nodes(out: Path) -> Path:
    """llm-edge with its workers copied to 1,000 (the control node kept once)."""
    docs = [d for d in yaml.safe_load_all((LLM_EDGE / "nodes.yaml").read_text()) if d]
    workers = [d for d in docs if d["spec"].get("role") == "worker"]
    nodes = [d for d in docs if d["spec"].get("role") != "worker"]
    for i in range(1000):
        base = workers[i % len(workers)]
        nodes.append({**base, "metadata": {"name": f"{base['metadata']['name']}-{i}"}})
    out.mkdir(parents=True)
    (out / "nodes.yaml").write_text(yaml.safe_dump_all(nodes))
    (out / "services.yaml").write_text((LLM_EDGE / "services.yaml").read_text())
    scenario = yaml.safe_load((LLM_EDGE / "scenario.yaml").read_text())
    scenario["metadata"]["name"] = "llm-edge-1000"
    (out / "scenario.yaml").write_text(yaml.safe_dump(scenario))
    return out


@pytest.mark.timeout(3600)
def test_thousand_node_variant(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    slots = int(os.environ.get("LMEDGE_TOKEN_SIM_SLOTS", "5"))
    path = _thousand_nodes(tmp_path / "llm-edge-1000")
    row = {"scenario": "llm-edge x1000"} | _counted_run(
        RunSpec(path, PolicyChoice(POLICY), 1, slots, settle=False), monkeypatch
    )
    print(HEADER)
    for r in [*ROWS, row]:
        _print(r)
    assert row["requests"] > 0


def test_step_cost_against_running_sequences() -> None:
    """µs per engine step with N sequences running (the engine kept full)."""
    profile = ThroughputProfile(
        prefill_tokens_per_s=8000,
        decode=[DecodePoint(running=1, tokens_per_s=160),
                DecodePoint(running=64, tokens_per_s=3600)],
    )  # fmt: skip
    rng = random.Random(1)
    print(f"\n{'running':>7} {'steps':>7} {'µs/step':>8} {'µs/step/seq':>11}")
    for n in (1, 8, 64, 256, 1024):
        engine = BatchingEngine(profile, kv_capacity_tokens=10**9, max_running=n)
        rid = 0
        for _ in range(n):
            rid += 1
            engine.submit(TokenRequest(rid, 0.0, 70, rng.randint(50, 400)), 0.0)
        started = time.perf_counter()
        while engine.steps < 2_000:
            t = engine.next_event_time()
            assert t is not None
            for _ in engine.advance(t):  # keep it full: a new request per finished one
                rid += 1
                engine.submit(TokenRequest(rid, t, 70, rng.randint(50, 400)), t)
        us = 1e6 * (time.perf_counter() - started) / engine.steps
        print(f"{n:>7} {engine.steps:>7} {us:>8.1f} {us / n:>11.3f}")
