"""The scoring guard's effect (run by `make bench`; issue 15 item 3).

`ma` on `testbed`, 100 slots (settling after), seeds 1-3, three ways:

- `rules`: the three agents on their rule backends (no LLM);
- `unguarded`: the router on a scripted "valid but harmful" LLM (the local
  test server's `one_node`: every pair routed to one node, nothing refused,
  feasible and valid) with the scoring guard off (`llm_guard=off`);
- `guarded`: the same LLM, the guard on (the default).

The target: guarded J within `GUARD_MARGIN` of the rules' J on every seed;
unguarded J is reported (it collapses). The router is the agent on the
LLM; planner and deployers stay on rules, so the difference is the
routing decision alone. A row for a real small model belongs to the
agents bench (benchmarks/test_agents_bench.py). Numbers are printed and
written to reports/bench-guard.json.
"""

from __future__ import annotations

import importlib.util
import json
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from lmedge.agents.scoring import GUARD_MARGIN
from lmedge.backends.emulated.backend import EmulatedBackend
from lmedge.controller.assembly import PolicyChoice, build_plugins
from lmedge.controller.loop import ControlLoop
from lmedge.metrics import metric_lms, window_metrics
from lmedge.sim.scenario import load_scenario

pytestmark = pytest.mark.bench

ROOT = Path(__file__).resolve().parents[1]
TESTBED = ROOT / "examples" / "testbed"
SLOTS = 100
SEEDS = (1, 2, 3)


def _llm_server_module() -> ModuleType:
    # the scripted OpenAI-compatible server of the test suite (no package import path here)
    path = ROOT / "tests" / "fixtures" / "llm_server.py"
    spec = importlib.util.spec_from_file_location("_lmedge_bench_llm_server", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def harmful_url() -> Iterator[str]:
    with _llm_server_module().running_server() as server:
        server.default = "one_node"
        server.keep_bodies = False
        yield server.base_url


def _objective(params: dict[str, dict[str, Any]], seed: int) -> dict[str, Any]:
    started = time.perf_counter()
    backend = EmulatedBackend(load_scenario(TESTBED), seed=seed)
    plugins = build_plugins(PolicyChoice("ma", params=params), backend.context(), seed)
    result = ControlLoop(backend, plugins, run_id=f"guard-bench-{seed}", seed=seed).run(
        SLOTS, settle_slots=30
    )
    ctx, records = result.context, result.measured_records()
    m = window_metrics(
        records,
        metric_lms(ctx, records),
        tau_s=ctx.tau_s,
        lam=ctx.lam,
        deadlines={lm: ctx.deadline_s(lm) for lm in ctx.lm_names},
    )
    routed = [d for d in result.decisions if d.agent == "scheduler"]
    assert m.objective is not None
    return {
        "objective": round(m.objective, 6),
        "success": round(m.successes / m.requests, 6) if m.requests else None,
        "router_llm": sum(d.source == "llm" for d in routed),
        "router_overruled": sum(d.guard is not None and d.guard.chosen == "rule" for d in routed),
        "wall_s": round(time.perf_counter() - started, 2),
    }


def test_guard_keeps_a_harmful_llm_within_the_margin(harmful_url: str) -> None:
    llm = {"llm_base_url": harmful_url, "llm_timeout_s": 5.0, "llm_budget_s": 10.0}
    variants = {
        "rules": {},
        "unguarded": {"router": {**llm, "llm_guard": "off"}},
        "guarded": {"router": llm},
    }
    rows: dict[str, dict[str, Any]] = {}
    for seed in SEEDS:
        rows[str(seed)] = {name: _objective(p, seed) for name, p in variants.items()}
        r = rows[str(seed)]
        print(
            f"seed {seed}: J rules {r['rules']['objective']:.4f}  "
            f"unguarded {r['unguarded']['objective']:.4f}  "
            f"guarded {r['guarded']['objective']:.4f} "
            f"(router calls overruled {r['guarded']['router_overruled']}/{SLOTS + 30})"
        )
    mean = {
        name: round(sum(rows[str(s)][name]["objective"] for s in SEEDS) / len(SEEDS), 6)
        for name in variants
    }
    out = ROOT / "reports" / "bench-guard.json"
    out.parent.mkdir(exist_ok=True)
    report = {"scenario": "testbed", "slots": SLOTS, "margin": GUARD_MARGIN, "mean": mean}
    out.write_text(json.dumps({**report, "seeds": rows}, indent=2) + "\n")
    print(f"mean J: {mean}; written to {out}")
    for seed in SEEDS:
        r = rows[str(seed)]
        assert r["guarded"]["objective"] <= r["rules"]["objective"] + GUARD_MARGIN, (seed, r)
