"""The three agents against a real local OpenAI-compatible server (tests/fixtures/llm_server.py).

Every scripted fault must end in the documented outcome within the agent's
time budget, with an audit record, and never raise:

- unusable replies (malformed, wrong schema, empty) and failed calls
  (timeout, 429, 5xx): `source="fallback"`, `outcome="replaced"`, the error and
  the raw reply kept, the paper's fallback value (random macro policy, local
  routing, the node's running set);
- parsed but infeasible decisions: `source="llm"`, `validated=False` with the
  violations, for the controller to replace;
- a server that rejects `json_schema` (HTTP 400): answered in JSON mode, and
  remembered for the next call.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from lmedge.agents import AgenticDeployer, AgenticPlanner, AgenticRouter
from lmedge.agents.llm import DIALECT_REFUSALS
from lmedge.agents.rules.planner import RulePlannerState, rule_macro_policy
from lmedge.api import (
    ClusterContext,
    Decision,
    NodeObservation,
    PlanningObservation,
    SlotObservation,
    capabilities_of,
    check_macro_policy,
    check_placement,
    check_routing_map,
)
from lmedge.backends.emulated.backend import EmulatedBackend
from lmedge.controller.assembly import PolicyChoice, build_plugins
from lmedge.controller.loop import FIRST_TRAFFIC_SLOTS, ControlLoop
from lmedge.sim.scenario import load_scenario
from tests.fixtures.llm_server import LLMServer

TESTBED = Path(__file__).resolve().parents[2] / "examples" / "testbed"
TIMEOUT_S = 0.5
BUDGET_S = 2.0


def _params(server: LLMServer, **extra: Any) -> dict[str, Any]:
    return {
        "llm_base_url": server.base_url,
        "llm_timeout_s": TIMEOUT_S,
        "llm_budget_s": BUDGET_S,
        "llm_max_retries": 1,
        **extra,
    }


@pytest.fixture(scope="module")
def world() -> tuple[ClusterContext, PlanningObservation, SlotObservation, NodeObservation]:
    backend = EmulatedBackend(load_scenario(TESTBED), seed=1)
    ctx = backend.context()
    plan_obs = PlanningObservation(epoch=0, context=ctx)
    macro = rule_macro_policy(plan_obs, RulePlannerState())
    snap = backend.snapshot(0)
    arrivals = [a for a in backend.arrivals(0) if a.requests > 0]
    slot_obs = SlotObservation(
        slot=0, epoch=0, context=ctx, macro=macro, snapshot=snap, arrivals=arrivals
    )
    node = ctx.node("worker-2")
    node_obs = NodeObservation(
        slot=0,
        epoch=0,
        node=node,
        services=ctx.services,
        roles=macro.role_map()["worker-2"],
        state=snap.node("worker-2").model_copy(
            update={"backlog": {"lm3": 6, "lm4": 3}, "free_vgpus": 2, "free_cpu_cores": 16}
        ),
    )
    return ctx, plan_obs, slot_obs, node_obs


def _decide(agent: str, server: LLMServer, world: Any) -> Decision[Any]:
    ctx, plan_obs, slot_obs, node_obs = world
    params = _params(server)
    if agent == "planner":
        return AgenticPlanner.build(ctx, params, seed=3).plan(plan_obs)
    if agent == "scheduler":
        return AgenticRouter.build(ctx, params).route(slot_obs)
    return AgenticDeployer.build(ctx, params).place(node_obs)


def _rule(agent: str, world: Any) -> Any:
    """The value the agent's rule backend decides for the same observation (no endpoint)."""
    ctx, plan_obs, slot_obs, node_obs = world
    if agent == "planner":
        return AgenticPlanner.build(ctx, {}, seed=3).plan(plan_obs).value
    if agent == "scheduler":
        return AgenticRouter.build(ctx, {}).route(slot_obs).value
    return AgenticDeployer.build(ctx, {}).place(node_obs).value


def _violations(agent: str, d: Decision[Any], world: Any) -> list[Any]:
    ctx, _, slot_obs, node_obs = world
    if agent == "planner":
        return check_macro_policy(d.value, ctx)
    if agent == "scheduler":
        return check_routing_map(d.value, ctx, slot_obs.arrivals)
    return check_placement(d.value, node_obs.node, node_obs.services)


AGENTS = ["planner", "scheduler", "deployer"]


@pytest.mark.parametrize("agent", AGENTS)
def test_good_reply_is_accepted_with_tokens_and_model(
    agent: str, llm_server: LLMServer, world: Any
) -> None:
    d = _decide(agent, llm_server, world)
    assert (d.source, d.parsed, d.validated, d.outcome) == ("llm", True, True, "accepted")
    assert d.raw and d.tokens_in > 0 and d.tokens_out > 0 and d.model
    assert d.error is None and not d.violations
    assert _violations(agent, d, world) == []
    assert llm_server.schemas == ["json_schema"]


@pytest.mark.parametrize("agent", AGENTS)
@pytest.mark.parametrize("fault", ["malformed", "wrong_schema", "empty"])
def test_unusable_reply_falls_back_after_one_repair(
    agent: str, fault: str, llm_server: LLMServer, world: Any
) -> None:
    llm_server.default = fault
    d = _decide(agent, llm_server, world)
    assert (d.source, d.parsed, d.validated, d.outcome) == ("fallback", False, False, "replaced")
    assert d.error
    assert len(llm_server.bodies) == 2, "one repair turn, then the fallback"
    assert _violations(agent, d, world) == [], "the fallback value is feasible"
    assert d.value == _rule(agent, world), "the fallback is the agent's own rule decision"
    if fault != "empty":
        assert d.raw


@pytest.mark.parametrize("agent", AGENTS)
def test_repair_turn_recovers(agent: str, llm_server: LLMServer, world: Any) -> None:
    llm_server.script("malformed")
    d = _decide(agent, llm_server, world)
    assert (d.source, d.validated) == ("llm", True)
    assert len(llm_server.bodies) == 2
    assert "not valid JSON" in llm_server.bodies[1]


INFEASIBLE = [
    (agent, fault) for agent in AGENTS for fault in ("gpu_on_cpu", "bad_sum", "unknown_name")
] + [("planner", "repeat"), ("scheduler", "repeat"), ("deployer", "tiny_cpu")]


@pytest.mark.parametrize(("agent", "fault"), INFEASIBLE, ids=[f"{a}-{f}" for a, f in INFEASIBLE])
def test_infeasible_reply_runs_the_rule_with_the_violations_kept(
    agent: str, fault: str, llm_server: LLMServer, world: Any
) -> None:
    llm_server.default = fault
    d = _decide(agent, llm_server, world)
    assert (d.source, d.parsed, d.validated, d.outcome) == ("fallback", True, False, "replaced")
    assert d.violations, "why the LLM's value was not used"
    assert d.raw, "the LLM's reply stays in the audit"
    assert d.value == _rule(agent, world), "the agent's own rule decision runs"
    assert _violations(agent, d, world) == []
    assert len(llm_server.bodies) == 2, "the violations were sent back once"
    assert "infeasible" in llm_server.bodies[1]


@pytest.mark.parametrize("agent", AGENTS)
@pytest.mark.parametrize("fault", ["timeout", "429", "500", "503"])
def test_failed_calls_fall_back_within_budget(
    agent: str, fault: str, llm_server: LLMServer, world: Any
) -> None:
    llm_server.default = fault
    llm_server.slow_s = TIMEOUT_S * 3
    started = time.monotonic()
    d = _decide(agent, llm_server, world)
    elapsed = time.monotonic() - started
    assert (d.source, d.outcome) == ("fallback", "replaced")
    assert d.error and ("timed out" in d.error or fault in d.error)
    assert elapsed < BUDGET_S + 1.0
    assert 1 <= len(llm_server.bodies) <= 3
    assert _violations(agent, d, world) == []
    assert d.value == _rule(agent, world), "a failed call runs the agent's own rule"


@pytest.mark.parametrize("fault", ["429", "503", "timeout"])
def test_transient_failure_is_retried(fault: str, llm_server: LLMServer, world: Any) -> None:
    llm_server.slow_s = TIMEOUT_S * 3
    llm_server.script(fault)
    d = _decide("scheduler", llm_server, world)
    assert (d.source, d.validated) == ("llm", True)
    assert llm_server.served[:2] == [fault, "good"]


@pytest.mark.parametrize("agent", AGENTS)
@pytest.mark.parametrize("wrapping", ["fenced", "prose_fenced", "prose_json", "bom"])
def test_wrapped_json_is_recovered_without_a_repair(
    agent: str, wrapping: str, llm_server: LLMServer, world: Any
) -> None:
    llm_server.default = wrapping
    d = _decide(agent, llm_server, world)
    assert (d.source, d.parsed, d.validated, d.outcome) == ("llm", True, True, "accepted")
    assert d.raw and d.error is None, "the reply is kept verbatim for the audit"
    assert llm_server.served == [wrapping], "the object was taken from the first reply"
    assert _violations(agent, d, world) == []


#: Replies that carry no usable decision, however often they are repeated
#: (a routing map has no number for `infinity` to replace).
UNUSABLE = [
    (agent, fault)
    for agent in AGENTS
    for fault in ("html", "null_message", "no_choices", "infinity")
    if (agent, fault) != ("scheduler", "infinity")
]
#: Replies whose decision is good but whose usage numbers are not.
BAD_USAGE = ["bad_usage", "huge_usage"]


@pytest.mark.parametrize(("agent", "fault"), UNUSABLE, ids=[f"{a}-{f}" for a, f in UNUSABLE])
def test_broken_reply_every_time_ends_in_the_fallback(
    agent: str, fault: str, llm_server: LLMServer, world: Any
) -> None:
    llm_server.default = fault
    d = _decide(agent, llm_server, world)
    assert (d.source, d.parsed, d.validated, d.outcome) == ("fallback", False, False, "replaced")
    assert d.error, "the audit record says why"
    assert _violations(agent, d, world) == [], "the fallback value is feasible"
    assert 1 <= len(llm_server.bodies) <= 2, "one retry or one repair at most"


@pytest.mark.parametrize(("agent", "fault"), UNUSABLE, ids=[f"{a}-{f}" for a, f in UNUSABLE])
def test_broken_reply_once_is_retried_or_repaired(
    agent: str, fault: str, llm_server: LLMServer, world: Any
) -> None:
    llm_server.script(fault)
    d = _decide(agent, llm_server, world)
    assert (d.source, d.parsed, d.validated, d.outcome) == ("llm", True, True, "accepted")
    assert llm_server.served == [fault, "good"]


@pytest.mark.parametrize("agent", AGENTS)
@pytest.mark.parametrize("fault", BAD_USAGE)
def test_bogus_usage_is_estimated_not_trusted(
    agent: str, fault: str, llm_server: LLMServer, world: Any
) -> None:
    llm_server.default = fault
    d = _decide(agent, llm_server, world)
    assert (d.source, d.validated, d.outcome) == ("llm", True, "accepted")
    # Estimated from the text (4 characters a token): positive and far below 2^63.
    prompt_chars = len(llm_server.bodies[0])
    assert 0 < d.tokens_in <= prompt_chars
    assert 0 < d.tokens_out <= len(d.raw or "")


@pytest.mark.parametrize("fault", ["no_json_schema", "json_schema_422", "json_schema_500"])
def test_json_schema_refusals_switch_to_the_llama_dialect_once_repeated(
    fault: str, llm_server: LLMServer, world: Any
) -> None:
    # Whatever the status of the refusal (400, 422, llama-cpp-python's 500), the refused
    # call asks again at once in `{"type": "json_object", "schema": S}`; the endpoint is
    # remembered to speak it after DIALECT_REFUSALS refused calls, not after one.
    llm_server.default = fault
    decided = [_decide("deployer", llm_server, world) for _ in range(DIALECT_REFUSALS + 1)]
    assert [(d.source, d.validated) for d in decided] == [("llm", True)] * len(decided)
    assert llm_server.schemas == ["json_schema", "json_object"] * DIALECT_REFUSALS + ["json_object"]
    fmt = json.loads(llm_server.bodies[1])["response_format"]
    # the schema the grammar enforces: every LM of the scenario once, by name
    assert set(fmt["schema"]["properties"]["lms"]["required"]) == {"lm1", "lm2", "lm3", "lm4"}
    # the server enforces it: the prompt does not carry it
    assert "JSON Schema named" not in llm_server.bodies[1]


def test_one_refusal_does_not_degrade_the_endpoint(llm_server: LLMServer, world: Any) -> None:
    # A capable endpoint that once answers json_schema with a 500 naming the format
    # (a transient failure) keeps being asked in json_schema afterwards.
    llm_server.default = "json_schema_500"
    assert _decide("deployer", llm_server, world).source == "llm"
    llm_server.default = "good"
    assert _decide("deployer", llm_server, world).source == "llm"
    assert llm_server.schemas == ["json_schema", "json_object", "json_schema"]


def test_every_request_bounds_its_generation(llm_server: LLMServer, world: Any) -> None:
    for agent in AGENTS:
        _decide(agent, llm_server, world)
    assert len(llm_server.bodies) == len(AGENTS)
    for raw in llm_server.bodies:
        body = json.loads(raw)
        assert isinstance(body["max_tokens"], int) and 0 < body["max_tokens"] <= 4096
        assert body["temperature"] == pytest.approx(0.2)


def test_ma_runs_end_to_end_on_the_llm_path(llm_server: LLMServer) -> None:
    backend = EmulatedBackend(load_scenario(TESTBED, loop={"epoch_slots": 10}), seed=1)
    ctx = backend.context()
    # The server answers well; budgets a loaded 2-core machine cannot exhaust, so
    # the test is about the path, not about how fast the test server replies.
    params = _params(llm_server, llm_timeout_s=10.0, llm_budget_s=20.0)
    choice = PolicyChoice(
        profile="ma", params={"planner": params, "router": params, "deployer": params}
    )
    loop = ControlLoop(backend, build_plugins(choice, ctx, 1), run_id="ma-llm", seed=1)
    result = loop.run(20)
    kinds = {d.agent for d in result.decisions}
    assert kinds == {"planner", "scheduler", "deployer"}
    routed = [d for d in result.decisions if d.agent != "scheduler" or d.raw is not None]
    assert routed and all(d.source == "llm" and d.outcome == "accepted" for d in routed)
    # slot 0 (no traffic yet), the re-plan once traffic is seen (`ma` follows the
    # traffic), and the epoch boundary at slot 10
    plans = [d for d in result.decisions if d.agent == "planner"]
    assert [d.slot for d in plans] == [0, FIRST_TRAFFIC_SLOTS, 10]
    assert (plans[1].trigger or "").startswith("first traffic")
    # Every decision asked the LLM; a slow reply may be retried once (max_retries=1),
    # so the count of bodies is bounded, not exact.
    assert len(routed) <= len(llm_server.bodies) <= 2 * len(routed)
    assert any(r.outcome == "success" for r in result.records)


def test_ma_survives_a_storm_of_faults(llm_server: LLMServer) -> None:
    backend = EmulatedBackend(load_scenario(TESTBED, loop={"epoch_slots": 5}), seed=2)
    ctx = backend.context()
    params = _params(llm_server, llm_timeout_s=0.2, llm_budget_s=0.6)
    llm_server.slow_s = 0.4
    faults = ["malformed", "gpu_on_cpu", "timeout", "503", "bad_sum", "good", "429", "empty"]
    llm_server.script(*(faults * 40))
    choice = PolicyChoice(
        profile="ma", params={"planner": params, "router": params, "deployer": params}
    )
    loop = ControlLoop(backend, build_plugins(choice, ctx, 2), run_id="ma-storm", seed=2)
    result = loop.run(10)
    assert result.slots == 10
    for d in result.decisions:
        if d.source == "fallback":
            assert d.outcome == "replaced" and (d.error or d.violations)
        if not d.validated:
            assert d.violations or d.error
            assert d.outcome == "replaced"
    assert any(d.source == "fallback" for d in result.decisions)
    assert any(d.source == "llm" and d.outcome == "accepted" for d in result.decisions)


def test_cli_simulate_ma_uses_the_llm_endpoint(llm_server: LLMServer, tmp_path: Path) -> None:
    import json
    import subprocess
    import sys

    cmd = [
        sys.executable,
        "-c",
        "from lmedge.cli import main; main()",
        "simulate",
        "-f",
        str(TESTBED),
        "--policy",
        "ma",
        "--slots",
        "3",
        "--no-store",
        "--no-settle",
        "--json",
        "--llm-base-url",
        llm_server.base_url,
        "--llm-model",
        "test-model",
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["policy"] == "ma"
    bodies = [json.loads(b) for b in llm_server.bodies]
    assert len(bodies) >= 1 + 3 + 3 * 6, "planner, scheduler and six deployers per slot"
    assert {b["model"] for b in bodies} == {"test-model"}


def test_cli_llm_options_need_an_agentic_tier(llm_server: LLMServer, tmp_path: Path) -> None:
    import subprocess
    import sys

    cmd = [
        sys.executable,
        "-c",
        "from lmedge.cli import main; main()",
        "simulate",
        "--policy",
        "rr",
        "--no-store",
        "--llm-base-url",
        llm_server.base_url,
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 2
    assert "need an agentic" in done.stderr and "Traceback" not in done.stderr


def test_deployers_run_concurrently_only_on_the_llm_path(
    llm_server: LLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key in [k for k in os.environ if k.startswith("LMEDGE_")]:
        monkeypatch.delenv(key)
    ctx = load_scenario(TESTBED).context()
    assert capabilities_of(AgenticDeployer.build(ctx, _params(llm_server))).io_bound
    assert not capabilities_of(AgenticDeployer.build(ctx, {})).io_bound


def test_other_bad_request_is_a_fallback_not_a_format_switch(
    llm_server: LLMServer, world: Any
) -> None:
    llm_server.default = "400"
    d = _decide("deployer", llm_server, world)
    assert (d.source, d.outcome) == ("fallback", "replaced")
    assert d.error and d.error.startswith("bad request (400)")
    llm_server.default = "good"
    assert _decide("deployer", llm_server, world).source == "llm"
    assert llm_server.schemas == ["json_schema", "json_schema"]
