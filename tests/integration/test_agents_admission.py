"""The agentic router's admission control with an LLM (the local OpenAI-compatible
test server, through the real `openai` SDK): rejections are allowed exactly when
`admit_fraction` is on, and the prompt says which."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lmedge.agents import AgenticRouter
from lmedge.agents.rules.planner import RulePlannerState, rule_macro_policy
from lmedge.api import PlanningObservation, SlotObservation, check_routing_map
from lmedge.backends.emulated.backend import EmulatedBackend
from lmedge.sim.scenario import load_scenario
from tests.fixtures.llm_server import LLMServer

TESTBED = Path(__file__).resolve().parents[2] / "examples" / "testbed"


def _slot(backlog: int) -> SlotObservation:
    backend = EmulatedBackend(load_scenario(TESTBED), seed=1)
    ctx = backend.context()
    macro = rule_macro_policy(PlanningObservation(epoch=0, context=ctx), RulePlannerState())
    snap = backend.snapshot(0)
    if backlog:
        nodes = [
            n.model_copy(update={"backlog": dict.fromkeys(ctx.lm_names, backlog)})
            for n in snap.nodes
        ]
        snap = snap.model_copy(update={"nodes": nodes})
    arrivals = [a for a in backend.arrivals(0) if a.requests > 0]
    return SlotObservation(
        slot=0, epoch=0, context=ctx, macro=macro, snapshot=snap, arrivals=arrivals
    )


def _router(server: LLMServer, **extra: Any) -> AgenticRouter:
    params = {"llm_base_url": server.base_url, "llm_timeout_s": 0.5, "llm_budget_s": 2.0}
    return AgenticRouter.build(_slot(0).context, {**params, **extra})


def _system(server: LLMServer) -> str:
    messages = json.loads(server.bodies[0])["messages"]
    return str(next(m["content"] for m in messages if m["role"] == "system"))


def test_a_rejection_is_infeasible_when_admission_is_off(llm_server: LLMServer) -> None:
    llm_server.default = "reject"
    obs = _slot(0)
    d = _router(llm_server, admit_fraction="off").route(obs)
    assert (d.source, d.parsed, d.validated) == ("fallback", True, False), "the rule runs"
    assert not d.value.rejections, "the rule admits everything with admission off"
    assert any("admission control is off" in v for v in d.violations)
    assert "Admission control is off" in _system(llm_server)
    assert len(llm_server.bodies) == 2, "the violation was sent back once"


def test_the_llm_may_reject_when_admission_is_on(llm_server: LLMServer) -> None:
    llm_server.default = "reject"
    obs = _slot(0)
    d = _router(llm_server, admit_fraction="0.5").route(obs)
    assert (d.source, d.validated, d.outcome) == ("llm", True, "accepted")
    assert len(d.value.rejections) == 1 and not d.violations
    assert check_routing_map(d.value, obs.context, obs.arrivals) == []
    assert "Admission control is on" in _system(llm_server)


def test_the_rules_suggested_rejections_reach_the_llm(llm_server: LLMServer) -> None:
    obs = _slot(backlog=2000)  # every queue far beyond half the deadline
    d = _router(llm_server, admit_fraction="0.5").route(obs)
    assert (d.source, d.validated) == ("llm", True)
    user = next(
        m["content"] for m in json.loads(llm_server.bodies[0])["messages"] if m["role"] == "user"
    )
    assert "->REJECT" in user
    pairs = {(a.origin, a.lm) for a in obs.arrivals}
    assert d.value.rejected() == pairs and d.value.routes == []
