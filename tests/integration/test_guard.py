"""The decision guard and the scoring guard, end to end on the emulated testbed.

Real parts: the agents talk to the local OpenAI-compatible test server
through the real `openai` SDK (tests/fixtures/llm_server.py), or to a port
where nothing listens; the loop drives the emulator.

- A broken LLM endpoint on a cold start must not leave the cluster empty:
  every agent falls back to its own rule decision, so the run serves exactly
  what the rule profile serves (it used to be 0%, exit 0).
- A valid but harmful LLM ("route everything to one node") collapses the
  objective when it is obeyed; with the scoring guard on (the default) the
  objective stays within the guard's margin of the rule's.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest

from lmedge.agents.scoring import GUARD_MARGIN
from lmedge.backends.emulated.backend import EmulatedBackend
from lmedge.controller.assembly import PolicyChoice, build_plugins
from lmedge.controller.loop import ControlLoop, RunResult
from lmedge.metrics import metric_lms, window_metrics
from lmedge.sim.scenario import load_scenario
from tests.fixtures.llm_server import LLMServer

TESTBED = Path(__file__).resolve().parents[2] / "examples" / "testbed"
SLOTS = 40


def _run(params: dict[str, dict[str, Any]], *, seed: int = 1, slots: int = SLOTS) -> RunResult:
    backend = EmulatedBackend(load_scenario(TESTBED), seed=seed)
    plugins = build_plugins(PolicyChoice("ma", params=params), backend.context(), seed)
    return ControlLoop(backend, plugins, run_id=f"guard-{seed}", seed=seed).run(
        slots, settle_slots=30
    )


def _objective(result: RunResult) -> float:
    ctx, records = result.context, result.measured_records()
    m = window_metrics(
        records,
        metric_lms(ctx, records),
        tau_s=ctx.loop.tau_s,
        lam=ctx.loop.lam,
        deadlines={lm: ctx.deadline_s(lm) for lm in ctx.lm_names},
    )
    assert m.objective is not None
    return m.objective


def _closed_port() -> int:
    """A local port where nothing listens (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def test_a_broken_endpoint_on_a_cold_start_serves_like_the_rules() -> None:
    url = f"http://127.0.0.1:{_closed_port()}/v1"
    llm = {"llm_base_url": url, "llm_max_retries": 0, "llm_timeout_s": 0.5, "llm_budget_s": 1}
    broken = _run({tier: dict(llm) for tier in ("planner", "router", "deployer")}, slots=10)
    rules = _run({}, slots=10)
    assert broken.decisions and all(d.source == "fallback" for d in broken.decisions)
    assert all(d.error for d in broken.decisions), "every call failed, and says why"
    served = [r.outcome for r in broken.measured_records()]
    assert served.count("success") > 0.5 * len(served), "the cold cluster is served"
    assert [(r.id, r.outcome, r.destination) for r in broken.measured_records()] == [
        (r.id, r.outcome, r.destination) for r in rules.measured_records()
    ], "the fallback is the rule decision, so the run is the rule profile's"


@pytest.fixture
def harmful(llm_server: LLMServer) -> dict[str, Any]:
    """Router settings for the test server answering every routing call with `one_node`."""
    llm_server.default = "one_node"
    return {"llm_base_url": llm_server.base_url, "llm_timeout_s": 2.0, "llm_budget_s": 4.0}


def test_the_scoring_guard_keeps_a_harmful_llm_within_the_margin(harmful: dict[str, Any]) -> None:
    rules = _objective(_run({}))
    unguarded_run = _run({"router": {**harmful, "llm_guard": "off"}})
    guarded_run = _run({"router": harmful})
    unguarded, guarded = _objective(unguarded_run), _objective(guarded_run)
    # the scripted decision really is harmful when obeyed ...
    assert all(d.source == "llm" for d in unguarded_run.decisions if d.agent == "scheduler")
    assert unguarded > rules + 0.1, (rules, unguarded)
    # ... and the guard keeps the run within its margin of the rule profile
    assert guarded <= rules + GUARD_MARGIN, (rules, guarded)
    overruled = [d for d in guarded_run.decisions if d.agent == "scheduler" and d.source == "rule"]
    assert overruled, "the guard overruled the model"
    for d in overruled:
        assert d.guard is not None and d.guard.chosen == "rule" and d.outcome == "replaced"
        scores = {c.source: c.objective for c in d.guard.candidates}
        assert scores["llm"] > scores["rule"] + d.guard.margin, d.guard
        assert d.raw, "the model's proposal stays in the audit"


def test_a_good_llm_passes_the_guard(llm_server: LLMServer) -> None:
    # `good` answers with the rule's own suggestion: estimated equal, so it runs
    params = {"router": {"llm_base_url": llm_server.base_url, "llm_timeout_s": 2.0}}
    result = _run(params, slots=5)
    routed = [d for d in result.decisions if d.agent == "scheduler" and d.raw]
    assert routed and all(d.source == "llm" and d.outcome == "accepted" for d in routed)
    assert all(d.guard is not None and d.guard.chosen == "llm" for d in routed)
