"""Prompts: the paper's sentences, and sizes that do not grow with the cluster needlessly."""

from __future__ import annotations

from lmedge.agents.memory import select_cases
from lmedge.agents.rendering import (
    TOP_K,
    SlotView,
    allowed_modes,
    engines_sentence,
    render_node,
    render_planning,
    render_slot,
)
from lmedge.agents.rules.deployer import rule_placement
from lmedge.agents.rules.planner import plan_macro
from lmedge.agents.rules.scheduler import candidates, rule_routing
from lmedge.api import (
    Arrival,
    ClusterContext,
    EpochMetrics,
    LMStats,
    MemoryCase,
    NodeObservation,
    NodeState,
    PlanningObservation,
)
from lmedge.api.engine_telemetry import EngineTelemetry
from lmedge.sim.scenario import Scenario


def _metrics() -> EpochMetrics:
    return EpochMetrics(
        per_lm=[
            LMStats(lm="lm1", arrivals=10, successes=9, success_ratio=0.9, mean_latency_s=210.5),
            LMStats(lm="lm2", arrivals=10, successes=7, success_ratio=0.7, mean_latency_s=245.3),
        ],
        requests=20,
        successes=16,
        mean_latency_s=314.2,
        jain=0.9,
        f_norm=0.81,
        t_norm=0.3,
        objective=0.25,
        off_role_ratio=0.095,
    )


def test_planner_prompt_reads_like_the_paper(ctx: ClusterContext) -> None:
    policy = plan_macro(ctx, {}, {})
    case = MemoryCase(
        epoch=0, traffic={"lm1": 5}, policy=policy, metrics=_metrics(), objective=0.25
    )
    obs = PlanningObservation(
        epoch=1,
        context=ctx,
        baseline=_metrics(),
        last=_metrics(),
        previous=policy,
        memory=[case],
        traffic={"lm1": 5},
    )
    system, user = render_planning(obs, select_cases(obs.memory, obs.traffic), policy)
    assert "fairness" in system and "JSON" in system
    assert (
        "In the last epoch, lm1/lm2 have success-only mean latencies 210.5, 245.3 s with "
        "success ratios 0.90, 0.70, respectively" in user
    )
    assert "normalized Jain fairness over success ratios is 0.81" in user
    assert "off-role ratio was 9.5%" in user
    assert "Under the random baseline policy" in user
    assert "Past case (best), epoch 0" in user
    assert "lm3 (image-to-text): GPU only" in user
    assert "worker-1 (uob): 24 cores, 32 GiB memory, no GPU." in user


def _slot_prompt(ctx: ClusterContext, origins: list[str]) -> tuple[str, str]:
    macro = plan_macro(ctx, {}, {})
    states = {n.name: NodeState(name=n.name) for n in ctx.workers}
    arrivals = [
        Arrival(origin=o, lm=lm, requests=1, prompts=3) for o in origins for lm in ctx.lm_names
    ]
    reference = rule_routing(ctx, macro, states, arrivals)
    ranked = {lm: candidates(ctx, macro, states, lm) for lm in ctx.lm_names}
    _, user = render_slot(SlotView(ctx, 0, 0, macro, states, arrivals, reference, ranked))
    pairs = next(x for x in user.splitlines() if x.startswith("Pairs to route"))
    return user, pairs


def test_scheduler_prompt_grows_with_the_pairs_not_the_nodes(
    testbed: Scenario, large: Scenario
) -> None:
    small_ctx, large_ctx = testbed.context(), large.context()
    origins = [n.name for n in small_ctx.workers]
    small, small_pairs = _slot_prompt(small_ctx, origins)
    big, big_pairs = _slot_prompt(large_ctx, origins)
    assert len(big) - len(big_pairs) < 1.3 * (len(small) - len(small_pairs))
    for line in big.splitlines():
        if line.startswith("- "):
            assert line.count(" p=") <= TOP_K
    every, every_pairs = _slot_prompt(large_ctx, [n.name for n in large_ctx.workers])
    assert len(every) - len(every_pairs) < 1.3 * (len(small) - len(small_pairs))


def test_deployer_prompt_sees_its_own_node_only(ctx: ClusterContext) -> None:
    node = ctx.node("worker-6")
    obs = NodeObservation(
        slot=3,
        epoch=0,
        node=node,
        services=ctx.services,
        roles=["lm3", "lm4"],
        state=NodeState(name="worker-6", backlog={"lm3": 7}, free_vgpus=4),
    )
    system, user = render_node(obs, rule_placement(obs))
    assert "2-GPU server" in system and "worker-6" in system
    assert "lm3: 7 queued prompts, off" in user
    others = [n.name for n in ctx.nodes if n.name != "worker-6"]
    assert not any(name in system + user for name in others)
    cpu = ctx.node("worker-1")
    cpu_system, _ = render_node(
        obs.model_copy(update={"node": cpu, "state": NodeState(name="worker-1")}),
        rule_placement(obs),
    )
    assert "CPU-only server" in cpu_system and "lm3 off only" in cpu_system


def test_the_deployer_prompt_states_the_modes_its_reply_schema_allows(
    ctx: ClusterContext,
) -> None:
    """Every node of the testbed: the sentence names, per LM, exactly the schema's modes."""
    for node in ctx.workers:
        obs = NodeObservation(
            slot=0, epoch=0, node=node, services=ctx.services, roles=[],
            state=NodeState(name=node.name),
        )  # fmt: skip
        system, _ = render_node(obs, rule_placement(obs))
        stated = system.split("fastest first: ", 1)[1].split(".", 1)[0]
        for part in stated.split("; "):
            lm, said = part.split(" ", 1)
            allowed = [m for m in allowed_modes(ctx.service(lm), node) if m != "off"]
            assert said == (" or ".join(allowed) if allowed else "off only"), (node.name, lm)
            assert tuple(allowed) == ctx.modes(node.name, lm)


def test_deployer_and_scheduler_prompts_mention_engine_telemetry_only_when_present(
    ctx: ClusterContext,
) -> None:
    engines = [EngineTelemetry(lm="lm3", kv_cache_usage=0.83, running=5, waiting=4)]
    plain = NodeState(name="worker-6", backlog={"lm3": 7})
    obs = NodeObservation(
        slot=3, epoch=0, node=ctx.node("worker-6"), services=ctx.services, roles=[], state=plain
    )
    _, without = render_node(obs, rule_placement(obs))
    with_engines = obs.model_copy(update={"state": plain.model_copy(update={"engines": engines})})
    _, user = render_node(with_engines, rule_placement(obs))
    sentence = (
        "Token engines (node/LM: KV cache in use, sequences):"
        " worker-6/lm3 KV 83%, 5 running, 4 waiting."
    )
    assert "Token engines" not in without
    assert user.replace(sentence + "\n", "") == without
    assert engines_sentence([plain]) is None
    assert engines_sentence([plain.model_copy(update={"engines": engines})]) == sentence
