"""Reply formats (rendering.py, hierarchy.py): schemas the server can enforce and the
deterministic expanders that turn compact replies into decisions."""

from __future__ import annotations

import json
from dataclasses import replace

import jsonschema_rs
import pytest

from lmedge.agents.hierarchy import (
    PROMPT_TOKEN_LIMIT,
    avoid_format,
    choose_form,
    demand_format,
    prompt_tokens,
    sample_planning,
    sample_slot,
)
from lmedge.agents.llm import LLMClient, LLMReply, ReplyFormat
from lmedge.agents.rendering import (
    REJECT,
    SlotView,
    parse_placement,
    parse_policy,
    parse_routing,
    placement_format,
    policy_format,
    routing_format,
)
from lmedge.agents.rules.capacity import GPU_POD_CORES
from lmedge.agents.rules.deployer import GPU_POD_MIN_CORES
from lmedge.agents.rules.planner import RulePlannerState, plan_macro, rule_macro_policy
from lmedge.agents.rules.scheduler import Plan, candidates, rule_routing
from lmedge.agents.settings import resolve_settings
from lmedge.api import (
    ClusterContext,
    InstanceState,
    MacroPolicy,
    NodeObservation,
    NodeState,
    Placement,
    PlanningObservation,
    check_macro_policy,
    check_placement,
)
from lmedge.api.schema import json_schema, strict_json_schema
from lmedge.sim.scenario import Scenario


def _node_obs(ctx: ClusterContext, node: str, **state: object) -> NodeObservation:
    return NodeObservation(
        slot=1, epoch=0, node=ctx.node(node), services=ctx.services, roles=["lm1"],
        state=NodeState(name=node, **state),  # type: ignore[arg-type]
    )  # fmt: skip


def test_placement_schema_names_every_lm_and_only_its_possible_modes(
    ctx: ClusterContext,
) -> None:
    cpu_node = next(n.name for n in ctx.workers if not n.spec.has_gpu)
    schema = placement_format(_node_obs(ctx, cpu_node)).schema
    lms = schema["properties"]["lms"]
    assert lms["required"] == ctx.lm_names and lms["additionalProperties"] is False
    for lm in ctx.lm_names:
        mode = lms["properties"][lm]["properties"]["mode"]["enum"]
        assert "gpu" not in mode, "a CPU-only node offers no gpu mode"
        assert lms["properties"][lm]["properties"]["vgpus"]["enum"] == [0]
    gpu_only = [s.name for s in ctx.services if s.spec.runs_on == "gpu-only"]
    assert all(lms["properties"][lm]["properties"]["mode"]["enum"] == ["off"] for lm in gpu_only)


def test_compact_placement_gets_its_cores_sized_deterministically(ctx: ClusterContext) -> None:
    node = next(n for n in ctx.workers if n.spec.has_gpu)
    text = [s.name for s in ctx.services if s.spec.runs_on == "cpu-or-gpu"]
    running = InstanceState(lm=text[0], mode="cpu", cpu_cores=3, vgpus=0, status="ready")
    obs = _node_obs(ctx, node.name, instances=[running])
    gpu_lm = next(s.name for s in ctx.services if s.spec.runs_on == "gpu-only")
    choice = {lm: {"mode": "off", "vgpus": 0} for lm in ctx.lm_names}
    choice[text[0]] = {"mode": "cpu", "vgpus": 2}  # vGPUs do not count in cpu mode
    choice[text[1]] = {"mode": "cpu", "vgpus": 0}
    choice[gpu_lm] = {"mode": "gpu", "vgpus": 0}  # gpu mode holds at least one
    p = parse_placement({"lms": choice}, obs).by_lm()
    assert (p[text[0]].cpu_cores, p[text[0]].vgpus) == (3, 0), "a running pod keeps its cores"
    assert (p[gpu_lm].cpu_cores, p[gpu_lm].vgpus) == (GPU_POD_CORES, 1)
    assert p[text[1]].cpu_cores == int(node.spec.cpu_cores - 3 - GPU_POD_CORES)
    assert all(p[lm].cpu_cores == 0 for lm in ctx.lm_names if choice[lm]["mode"] == "off")


def test_compact_placement_shares_scarce_cores_among_new_gpu_pods(ctx: ClusterContext) -> None:
    # 4 cores and 4 vGPUs, four LMs to start on a vGPU each: at GPU_POD_CORES (2)
    # each the reply would hold 8 cores and fail the check; as the rule does, they
    # share the cores, one each (GPU_POD_MIN_CORES).
    node = ctx.node("worker-2")
    spec = node.spec.model_copy(update={"vgpus_per_gpu": 4, "cpu_cores": 4})
    obs = _node_obs(ctx, "worker-2").model_copy(
        update={"node": node.model_copy(update={"spec": spec})}
    )
    lms = ["lm1", "lm2", "lm3", "lm4"]
    choice = {lm: {"mode": "gpu", "vgpus": 1} for lm in ctx.lm_names}
    placement = parse_placement({"lms": choice}, obs)
    assert check_placement(placement, obs.node, ctx.services) == []
    p = placement.by_lm()
    assert [(p[lm].cpu_cores, p[lm].vgpus) for lm in lms] == [(GPU_POD_MIN_CORES, 1)] * 4


def test_every_problem_of_a_compact_reply_is_named(ctx: ClusterContext) -> None:
    obs = _node_obs(ctx, "worker-2")
    lms = {"lm-x": {"mode": "gpu", "vgpus": 1}, "lm1": {"mode": "fast", "vgpus": 1}}
    with pytest.raises(ValueError) as err:
        parse_placement({"lms": lms}, obs)
    msg = str(err.value)
    assert "'lm-x' is not one of" in msg and "'fast'" in msg
    assert all(f"LM {lm!r} is missing" in msg for lm in ("lm2", "lm3", "lm4"))


def test_the_full_placement_is_taken_as_it_is(ctx: ClusterContext) -> None:
    obs = _node_obs(ctx, "worker-2")
    full = Placement(node="worker-2", lms=[]).model_dump(mode="json")
    assert parse_placement(full, obs) == Placement(node="worker-2", lms=[])


def _slot(ctx: ClusterContext):  # type: ignore[no-untyped-def]
    arrivals, states, macro = sample_slot(ctx)
    reference = rule_routing(ctx, macro, states, arrivals)
    plan = Plan.of(ctx, macro)
    ranked = {lm: candidates(ctx, macro, states, lm, plan=plan) for lm in ctx.lm_names}
    return arrivals, states, macro, reference, ranked


def test_routing_schema_has_one_key_per_pair_and_candidate_enums(ctx: ClusterContext) -> None:
    arrivals, _, _, reference, ranked = _slot(ctx)
    view = SlotView(ctx, 1, 0, None, {}, arrivals, reference, ranked, admit_fraction=0.3)
    fmt = routing_format(view)
    props = fmt.schema["properties"]["routes"]["properties"]
    assert set(props) == {f"{a.origin}/{a.lm}" for a in arrivals}
    for key, p in props.items():
        lm = key.split("/")[1]
        assert REJECT in p["enum"] and set(p["enum"]) - {REJECT} <= set(ctx.feasible_nodes(lm))
    assert fmt.max_tokens >= 25 * len(props)
    off = replace(view, admit_fraction=None)
    assert REJECT not in json.dumps(routing_format(off).schema)


def test_compact_routing_round_trips_the_rules_map(ctx: ClusterContext) -> None:
    _, _, _, reference, _ = _slot(ctx)
    compact = {f"{r.origin}/{r.lm}": r.destination for r in reference.routes}
    compact |= {f"{r.origin}/{r.lm}": REJECT for r in reference.rejections}
    got = parse_routing({"routes": compact}, reference)
    assert got.lookup() == reference.lookup() and got.rejected() == reference.rejected()
    with pytest.raises(ValueError, match="is missing"):
        parse_routing({"routes": dict(list(compact.items())[1:])}, reference)


def test_planner_weights_are_relative_and_normalised(ctx: ClusterContext) -> None:
    reference = plan_macro(ctx, {}, {})
    fmt = policy_format(ctx, reference)
    routing = {
        lm: {n: (3 if i == 0 else 1) for i, n in enumerate(ctx.feasible_nodes(lm))}
        for lm in fmt.schema["properties"]["routing"]["required"]
    }
    roles = {n: [] for n in fmt.schema["properties"]["roles"]["required"]}
    p = parse_policy({"routing": routing, "roles": roles}, ctx)
    for r in p.routing:
        assert sum(w.p for w in r.weights) == pytest.approx(1.0)
    zero = {**routing, "lm1": dict.fromkeys(routing["lm1"], 0)}
    with pytest.raises(ValueError, match="every weight is 0"):
        parse_policy({"routing": zero, "roles": roles}, ctx)


def test_demand_factors_of_one_are_the_rules_plan(ctx: ClusterContext) -> None:
    # the hierarchical planner loses nothing when it keeps the reference
    obs, _ = sample_planning(ctx)
    state = RulePlannerState()
    reference = rule_macro_policy(obs, state)
    fmt = demand_format(obs, state)
    ones = {"demand": dict.fromkeys(fmt.schema["properties"]["demand"]["required"], 1)}
    got = fmt.parse(ones)
    assert got.weights() == reference.weights() and got.role_map() == reference.role_map()
    more = {"demand": {**ones["demand"], "lm4": 2}}
    bigger = fmt.parse(more)
    assert check_macro_policy(bigger, ctx) == []
    assert len(bigger.weights()["lm4"]) >= len(reference.weights()["lm4"])


def test_avoiding_no_node_is_the_rules_routing_and_an_avoided_node_gets_nothing(
    ctx: ClusterContext,
) -> None:
    arrivals, states, macro, reference, ranked = _slot(ctx)
    fmt = avoid_format(SlotView(ctx, 1, 0, macro, states, arrivals, reference, ranked, 0.3))
    none = {"avoid": {lm: [] for lm in ranked}}
    assert fmt.parse(none) == reference
    lm = "lm1"
    top = ranked[lm][0].node
    got = fmt.parse({"avoid": {**none["avoid"], lm: [top]}})
    assert all(r.destination != top for r in got.routes if r.lm == lm)
    with pytest.raises(ValueError, match="not among its candidates"):
        fmt.parse({"avoid": {**none["avoid"], lm: ["control"]}})


def test_prompts_stop_growing_with_the_nodes(ctx: ClusterContext, large: Scenario) -> None:
    big = large.context()
    for agent in ("planner", "scheduler"):
        flat_small = prompt_tokens(agent, ctx, "flat")
        assert prompt_tokens(agent, ctx) == flat_small, "testbed keeps the paper's flat prompt"
        assert prompt_tokens(agent, big, "flat") > PROMPT_TOKEN_LIMIT
        assert prompt_tokens(agent, big) <= PROMPT_TOKEN_LIMIT
        # hierarchical: about as long on 120 workers as on 6
        assert prompt_tokens(agent, big, "hierarchical") < 1.5 * prompt_tokens(
            agent, ctx, "hierarchical"
        )
    assert choose_form("flat", ("x" * 10**6, "")) == "flat"


def test_the_repair_turn_lists_every_problem() -> None:
    client = LLMClient(resolve_settings("deployer", {"llm_base_url": "http://127.0.0.1:9/v1"}))
    reply: LLMReply[PlanningObservation] = LLMReply(raw='{"epoch": 0}')
    problems = [f"problem {i}" for i in range(12)]
    fmt = ReplyFormat({}, 10, lambda d: PlanningObservation.model_construct(**d))
    feedback = client._judge(reply, fmt, lambda v: problems)
    client.close()
    assert feedback is not None
    assert all(f"({i + 1}) problem {i}" in feedback for i in range(12))


def test_the_planned_modes_stay_out_of_the_planners_reply(ctx: ClusterContext) -> None:
    # The rule plan carries a mode per role LM (NodeRole.modes) for the rule
    # deployer; the LLM is never asked for it, in either reply form, and its
    # reply parses without it.
    reference = plan_macro(ctx, {}, {})
    assert any(r.modes for r in reference.roles)
    flat = policy_format(ctx, reference).schema
    strict = strict_json_schema(MacroPolicy)
    for schema in (flat, strict):
        assert '"modes"' not in json.dumps(schema)
    assert "modes" in json_schema(MacroPolicy)["$defs"]["NodeRole"]["properties"], "documented"
    roles = {
        r.node: r.lms for r in reference.roles if r.node in flat["properties"]["roles"]["required"]
    }
    routing = {r.lm: {w.node: w.p for w in r.weights} for r in reference.routing}
    parsed = parse_policy({"routing": routing, "roles": roles}, ctx)
    assert all(r.modes == {} for r in parsed.roles)
    assert parsed.role_map() == {n: lms for n, lms in reference.role_map().items() if n in roles}
    # The full form an LLM may send instead, as the strict schema shapes it.
    full = reference.model_dump(mode="json")
    for role in full["roles"]:
        role.pop("modes", None)
    validator = jsonschema_rs.Draft202012Validator(strict)
    assert [e.message for e in validator.iter_errors(full)] == []
    assert MacroPolicy.model_validate(full).mode_map() == {n: {} for n in reference.role_map()}
