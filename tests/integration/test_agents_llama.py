"""The agents against a real self-hosted LLM: llama-cpp-python's server and a 270M GGUF.

The server (tests/fixtures/llama_server.py) is the one a user runs; the
client finds its dialect (it refuses `json_schema` with a 500), asks with
`{"type": "json_object", "schema": S}`, and the grammar built from the
observation's schema keeps every reply parseable and every name the
scenario's. What the 270M base model decides is not judged here (it is a test
vehicle; benchmarks/test_agents_bench.py measures it): the tests assert what
the product guarantees with any model -- a parsed reply or the rule, never
an exception, names and counts from the schema, bounded generations, one call
at a time. On this CI's 2 cores one grammar-constrained call takes minutes
(about 1-2 s per generated token), so the observations are kept small and a
whole `ma` run on the model is the benchmark's job, not the suite's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from lmedge.agents import AgenticDeployer, AgenticPlanner, AgenticRouter
from lmedge.agents.llm import (
    DIALECT_REFUSALS,
    LLMClient,
    ReplyFormat,
    forget_endpoint_capabilities,
)
from lmedge.agents.rules.planner import RulePlannerState, rule_macro_policy
from lmedge.agents.settings import resolve_settings
from lmedge.api import NodeObservation, Placement, PlanningObservation, SlotObservation
from lmedge.backends.emulated.backend import EmulatedBackend
from lmedge.sim.scenario import load_scenario
from tests.fixtures.llama_server import LlamaServer

#: One call takes minutes on a loaded 2-core machine (the suite's default is 600 s a test).
pytestmark = pytest.mark.timeout(1800)

TESTBED = Path(__file__).resolve().parents[2] / "examples" / "testbed"


def _params(server: LlamaServer) -> dict[str, Any]:
    # Time is not what these tests are about: a loaded 2-core machine may take a
    # minute for one call, so the budgets are lifted off the slot (slot_cap off).
    return {
        "llm_base_url": server.base_url,
        "llm_model": server.model,
        "llm_timeout_s": 300,
        "llm_budget_s": 600,
        "llm_slot_cap": "off",
        "llm_max_retries": 1,
    }


@pytest.fixture
def fresh() -> None:
    forget_endpoint_capabilities()


@pytest.fixture(scope="module")
def world() -> tuple[Any, PlanningObservation, SlotObservation, NodeObservation]:
    backend = EmulatedBackend(load_scenario(TESTBED), seed=1)
    ctx = backend.context()
    plan_obs = PlanningObservation(epoch=0, context=ctx)
    macro = rule_macro_policy(plan_obs, RulePlannerState())
    snap = backend.snapshot(0)
    # two pairs: on 2 loaded cores the grammar-constrained 270M model generates
    # about one token a second (a 262k-token vocabulary checked per token)
    arrivals = [a for a in backend.arrivals(0) if a.requests > 0][:2]
    slot_obs = SlotObservation(
        slot=0, epoch=0, context=ctx, macro=macro, snapshot=snap, arrivals=arrivals
    )
    node_obs = NodeObservation(
        slot=0, epoch=0, node=ctx.node("worker-2"), services=ctx.services,
        roles=macro.role_map()["worker-2"],
        state=snap.node("worker-2").model_copy(update={"backlog": {"lm3": 6, "lm4": 3}}),
    )  # fmt: skip
    return ctx, plan_obs, slot_obs, node_obs


def test_the_client_finds_the_llama_dialect_and_serialises(
    llama_server: LlamaServer, fresh: None
) -> None:
    settings = resolve_settings("deployer", _params(llama_server), env={})
    client = LLMClient(settings)
    assert client.output_mode() == "json_schema" and not client.serial()
    # a one-integer reply keeps each grammar-constrained call short on 2 cores
    tiny = ReplyFormat(
        {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]},
        8,
        lambda data: data,
    )
    for i in range(DIALECT_REFUSALS):
        # llama-cpp-python refuses json_schema with HTTP 500; the call switched at once,
        # the endpoint only once the refusals repeat
        assert client.output_mode() == "json_schema" and not client.serial()
        reply = client.ask("Answer in JSON.", "Say nothing.", Placement, "placement", fmt=tiny)
        assert "json_schema rejected (500)" in (reply.error or "") or reply.calls >= 2, i
        assert reply.mode == "json_object_schema"
    assert client.output_mode() == "json_object_schema"
    assert client.serial(), "a llama.cpp-dialect endpoint serves one call at a time"
    client.close()


@pytest.mark.parametrize("agent", ["deployer", "scheduler", "planner"])
def test_each_agent_gets_a_parsed_reply_with_the_scenarios_names(
    agent: str, llama_server: LlamaServer, world: Any, fresh: None
) -> None:
    ctx, plan_obs, slot_obs, node_obs = world
    params = _params(llama_server)
    if agent == "planner":
        # the hierarchical form: a factor per LM (the flat one is ~300 tokens to generate)
        params = {**params, "prompt_form": "hierarchical"}
        d = AgenticPlanner.build(ctx, params, seed=3).plan(plan_obs)
    elif agent == "scheduler":
        d = AgenticRouter.build(ctx, params).route(slot_obs)
    else:
        d = AgenticDeployer.build(ctx, params).place(node_obs)
    # the grammar makes every reply parse: the decision is the LLM's (accepted or
    # judged by the guard), never the fallback of an unparsable reply
    assert d.parsed, d.error
    assert d.tokens_in > 0 and d.tokens_out > 0 and d.raw
    nodes, lms = {n.name for n in ctx.nodes}, set(ctx.lm_names)
    v = d.value
    if agent == "deployer":
        assert v.node == "worker-2" and sorted(p.lm for p in v.lms) == sorted(lms)
    elif agent == "scheduler":
        pairs = {(a.origin, a.lm) for a in slot_obs.arrivals}
        got = {(r.origin, r.lm) for r in v.routes} | v.rejected()
        assert got == pairs and {r.destination for r in v.routes} <= nodes
    else:
        assert {r.lm for r in v.routing} <= lms
        assert {w.node for r in v.routing for w in r.weights} <= nodes
