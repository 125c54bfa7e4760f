"""The control loop's validation, fallback, stamping, epoch and feedback paths.

A tiny in-process backend stands in for the world: it hands out fixed
arrivals, records what the loop actuates and turns every routed pair into
one finished request at the slot end. It implements `ClusterBackend` in
full; it is a test double of the emulator, not of a server.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from lmedge.api import (
    ActuationResult,
    Arrival,
    ClusterContext,
    Decision,
    InstanceState,
    LMPlacement,
    LoopConstants,
    MacroPolicy,
    NodeObservation,
    NodeState,
    NodeTelemetry,
    Placement,
    PlanningObservation,
    RequestRecord,
    RoutingMap,
    SlotObservation,
    Snapshot,
    check_macro_policy,
    check_placement,
)
from lmedge.api.live import ContextChange, ContextUpdate
from lmedge.controller.assembly import PolicyChoice, PolicyPlugins, build_plugins
from lmedge.controller.loop import ControlLoop
from lmedge.policies.local import local_routing
from lmedge.policies.uniform import uniform_macro_policy
from lmedge.sim.scenario import Scenario


class StepClock:
    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        return self.t

    def sleep_until(self, t: float) -> None:
        self.t = max(self.t, t)


class StubBackend:
    """Fixed arrivals; every routed request finishes successfully in its slot."""

    def __init__(self, ctx: ClusterContext, running: dict[str, list[InstanceState]] | None = None):
        self.clock = StepClock()
        self.ctx = ctx
        self.running = running or {}
        self.applied: list[Placement] = []
        self.published: list[RoutingMap] = []
        self._pending: list[RequestRecord] = []
        self.changes: dict[int, list[ContextChange]] = {}

    def context(self) -> ClusterContext:
        return self.ctx

    def refresh(self, slot: int) -> ContextUpdate:
        """A static cluster, unless a test queued `changes` for a slot."""
        return ContextUpdate(slot=slot, context=self.ctx, changes=self.changes.pop(slot, []))

    def snapshot(self, slot: int) -> Snapshot:
        nodes = [
            NodeState(name=n.name, instances=self.running.get(n.name, [])) for n in self.ctx.nodes
        ]
        return Snapshot(slot=slot, time_s=self.clock.now(), nodes=nodes)

    def arrivals(self, slot: int) -> list[Arrival]:
        return [
            Arrival(origin=n.name, lm=lm, requests=1, prompts=2)
            for n in self.ctx.workers
            for lm in self.ctx.lm_names
        ]

    def publish_routing(self, slot: int, routing: RoutingMap) -> None:
        self.published.append(routing)
        for i, r in enumerate(routing.routes):
            self._pending.append(
                RequestRecord(
                    id=f"{slot}-{i}",
                    lm=r.lm,
                    origin=r.origin,
                    destination=r.destination,
                    prompts=2,
                    prompts_done=2,
                    slot=slot,
                    submit_s=slot * self.ctx.loop.slot_s,
                    inference_s=10.0,
                    outcome="success",
                )
            )

    def apply_placement(self, placement: Placement) -> ActuationResult:
        self.applied.append(placement)
        return ActuationResult(node=placement.node)

    def drain_records(self) -> list[RequestRecord]:
        out, self._pending = self._pending, []
        return out

    def telemetry(self) -> list[NodeTelemetry]:
        return []

    def close(self) -> None:
        pass


@pytest.fixture
def ctx(testbed: Scenario) -> ClusterContext:
    return testbed.context().model_copy(update={"loop": LoopConstants(epoch_slots=3)})


def plugins(ctx: ClusterContext, **override: Any) -> PolicyPlugins:
    p = build_plugins(PolicyChoice("rf"), ctx, seed=1)
    for key, value in override.items():
        if key == "deployer":
            p.deployers = {n: value for n in p.deployers}
        else:
            setattr(p, key, value)
    return p


class RaisingRouter:
    name = "boom"

    def route(self, obs: SlotObservation) -> Decision[RoutingMap]:
        raise RuntimeError("router exploded")


class WrongTypeRouter:
    name = "wrong"

    def route(self, obs: SlotObservation) -> Any:
        return {"routes": []}


class ControlNodeRouter:
    """Sends everything to the control node, which hosts no LM."""

    name = "to-control"

    def route(self, obs: SlotObservation) -> Decision[RoutingMap]:
        m = local_routing(obs.context, obs.arrivals)
        for r in m.routes:
            r.destination = "control"
        return Decision[RoutingMap](agent="scheduler", policy=self.name, source="llm", value=m)


class GreedyDeployer:
    """Asks for 100 cores and LM3 on CPU: infeasible everywhere, repairable."""

    name = "greedy"

    def place(self, obs: NodeObservation) -> Decision[Placement]:
        lms = [LMPlacement(lm=s.name, mode="cpu", cpu_cores=100, vgpus=0) for s in obs.services]
        return Decision[Placement](
            agent="deployer",
            policy=self.name,
            source="llm",
            value=Placement(node=obs.node.name, lms=lms),
            node=obs.node.name,
        )


class RaisingDeployer:
    name = "boom"

    def place(self, obs: NodeObservation) -> Decision[Placement]:
        raise ValueError("deployer exploded")


class BadPlanner:
    """Weights that do not sum to 1 and an LM on a node without a GPU."""

    name = "bad"

    def __init__(self) -> None:
        self.seen: list[PlanningObservation] = []

    def plan(self, obs: PlanningObservation) -> Decision[MacroPolicy]:
        self.seen.append(obs)
        policy = MacroPolicy.model_validate(
            {
                "routing": [{"lm": "lm4", "weights": [{"node": "worker-1", "p": 0.5}]}],
                "roles": [],
            }
        )
        return Decision[MacroPolicy](agent="planner", policy=self.name, source="llm", value=policy)


class RecordingRouter:
    """Local routing that also learns from feedback."""

    name = "recording"
    io_bound = False

    def __init__(self) -> None:
        self.observed: list[RequestRecord] = []

    def route(self, obs: SlotObservation) -> Decision[RoutingMap]:
        value = local_routing(obs.context, obs.arrivals)
        return Decision[RoutingMap](agent="scheduler", policy=self.name, source="rule", value=value)

    def observe(self, records: Sequence[RequestRecord]) -> None:
        self.observed.extend(records)


def run(ctx: ClusterContext, p: PolicyPlugins, slots: int = 3, **kw: Any) -> Any:
    backend = StubBackend(ctx, kw.pop("running", None))
    loop = ControlLoop(backend, p, run_id="t", seed=1, **kw)
    return loop.run(slots), backend


def by_agent(result: Any, agent: str) -> list[Decision[Any]]:
    return [d for d in result.decisions if d.agent == agent]


@pytest.mark.parametrize(
    ("router", "error"),
    [
        (RaisingRouter(), "RuntimeError: router exploded"),
        (WrongTypeRouter(), "returned dict, not a RoutingMap"),
    ],
    ids=["raises", "wrong-type"],
)
def test_failing_router_falls_back_to_local_routing(
    ctx: ClusterContext, router: Any, error: str
) -> None:
    result, backend = run(ctx, plugins(ctx, router=router))
    for d, published in zip(by_agent(result, "scheduler"), backend.published, strict=True):
        assert d.source == "fallback" and d.outcome == "replaced"
        assert d.error == error
        assert d.value == published
        assert d.value == local_routing(ctx, backend.arrivals(0))


def test_infeasible_routing_is_replaced_and_violations_kept(ctx: ClusterContext) -> None:
    result, backend = run(ctx, plugins(ctx, router=ControlNodeRouter()), slots=1)
    (d,) = by_agent(result, "scheduler")
    assert d.outcome == "replaced" and d.source == "fallback" and not d.validated
    assert any("control is a control node" in v for v in d.violations)
    assert backend.published[0] == local_routing(ctx, backend.arrivals(0))


def test_infeasible_placement_is_mapped_to_nearest_feasible(ctx: ClusterContext) -> None:
    result, backend = run(ctx, plugins(ctx, deployer=GreedyDeployer()), slots=1)
    decisions = by_agent(result, "deployer")
    assert [d.node for d in decisions] == [n.name for n in ctx.workers]
    for d in decisions:
        node = ctx.node(d.node)
        assert d.outcome == "replaced" and d.source == "llm" and not d.validated
        assert any("CPU cores" in v for v in d.violations)
        assert check_placement(d.value, node, ctx.services) == []
    w2 = decisions[1]
    assert any("lm3 runs on GPU only" in v for v in w2.violations)
    assert backend.applied == [d.value for d in decisions]


def test_raising_deployer_keeps_what_runs(ctx: ClusterContext) -> None:
    running = {
        "worker-3": [InstanceState(lm="lm4", mode="gpu", cpu_cores=4, vgpus=2, status="ready")]
    }
    result, _ = run(ctx, plugins(ctx, deployer=RaisingDeployer()), slots=1, running=running)
    decisions = {d.node: d for d in by_agent(result, "deployer")}
    w3 = decisions["worker-3"]
    assert w3.source == "fallback" and w3.error == "ValueError: deployer exploded"
    assert w3.value.active() == {"lm4": LMPlacement(lm="lm4", mode="gpu", cpu_cores=4, vgpus=2)}
    assert decisions["worker-1"].value.active() == {}


def test_invalid_macro_policy_falls_back_to_random_baseline(ctx: ClusterContext) -> None:
    planner = BadPlanner()
    result, _ = run(ctx, plugins(ctx, planner=planner), slots=6)
    plans = by_agent(result, "planner")
    assert [(d.epoch, d.slot) for d in plans] == [(0, 0), (1, 3)]
    for d in plans:
        assert d.source == "fallback" and d.outcome == "replaced"
        assert any("sum to 0.5000" in v for v in d.violations)
        assert any("no GPU" in v for v in d.violations)
        assert check_macro_policy(d.value, ctx) == []
    # Epoch 1's planner sees epoch 0's metrics, the policy in force and one memory case.
    first, second = planner.seen
    assert first.last is None and first.previous is None and first.memory == []
    assert second.last == result.epochs[0]
    assert second.previous == plans[0].value
    assert [c.epoch for c in second.memory] == [0]
    assert sum(second.traffic.values()) == 3 * 6 * 4 * 2  # slots x origins x LMs x prompts


def test_decisions_are_stamped_by_the_runner(ctx: ClusterContext) -> None:
    result, _ = run(ctx, plugins(ctx), slots=4)
    assert {d.run for d in result.decisions} == {"t"}
    for d in result.decisions:
        assert d.epoch == d.slot // 3
        assert d.sim_time_s == d.slot * ctx.loop.slot_s
        assert d.latency_s >= 0
        assert (d.node is not None) == (d.agent == "deployer")
    assert len(result.timings) == 4
    assert [len(by_agent(result, a)) for a in ("planner", "scheduler", "deployer")] == [2, 4, 24]


def test_epoch_metrics_and_memory(ctx: ClusterContext) -> None:
    result, _ = run(ctx, plugins(ctx), slots=7)
    assert len(result.epochs) == 2  # slot 6 starts epoch 2, which does not end
    assert all(e.requests == 3 * 24 and e.successes == e.requests for e in result.epochs)
    assert len(result.records) == 7 * 24


def test_feedback_reaches_consumers(ctx: ClusterContext) -> None:
    router = RecordingRouter()
    result, _ = run(ctx, plugins(ctx, router=router), slots=2)
    assert router.observed == result.records


def test_io_bound_deployers_run_concurrently_in_node_order(ctx: ClusterContext) -> None:
    class Slow(GreedyDeployer):
        io_bound = True

    result, _ = run(ctx, plugins(ctx, deployer=Slow()), slots=2)
    nodes = [d.node for d in by_agent(result, "deployer")]
    assert nodes == [n.name for n in ctx.workers] * 2


class SelfCoveringRouter:
    """Reports an error (say, an LLM timeout) but covers it with its own valid map."""

    name = "covering"

    def route(self, obs: SlotObservation) -> Decision[RoutingMap]:
        return Decision[RoutingMap](
            agent="scheduler",
            policy=self.name,
            source="fallback",
            value=RoutingMap(routes=[]),
            error="LLMUnavailable: timed out",
        ).model_copy(update={"value": _all_to_worker_6(obs)})


def _all_to_worker_6(obs: SlotObservation) -> RoutingMap:
    m = local_routing(obs.context, obs.arrivals)
    for r in m.routes:
        r.destination = "worker-6"
    return m


def test_plugin_reported_error_keeps_its_valid_value(ctx: ClusterContext) -> None:
    result, backend = run(ctx, plugins(ctx, router=SelfCoveringRouter()), slots=1)
    (d,) = by_agent(result, "scheduler")
    assert d.error == "LLMUnavailable: timed out" and d.outcome == "accepted"
    assert {r.destination for r in backend.published[0].routes} == {"worker-6"}


class RolePlanner:
    """The static policy, but worker-2's role intent is lm4 only."""

    name = "role"

    def plan(self, obs: PlanningObservation) -> Decision[MacroPolicy]:
        policy = uniform_macro_policy(obs.context)
        for r in policy.roles:
            if r.node == "worker-2":
                r.lms = ["lm4"]
        return Decision[MacroPolicy](agent="planner", policy=self.name, source="rule", value=policy)


def test_repair_keeps_the_role_intent_longest(ctx: ClusterContext) -> None:
    result, _ = run(ctx, plugins(ctx, planner=RolePlanner(), deployer=GreedyDeployer()), slots=1)
    w2 = next(d for d in by_agent(result, "deployer") if d.node == "worker-2")
    assert w2.outcome == "replaced"
    # 16 cores: each repaired LM keeps all 16, so only one survives: the role's.
    assert list(w2.value.active()) == ["lm4"]


class Lm1OnWorker1Planner:
    """Uniform weights, but only worker-1 is meant to host lm1."""

    name = "lm1-on-worker-1"

    def plan(self, obs: PlanningObservation) -> Decision[MacroPolicy]:
        policy = uniform_macro_policy(obs.context)
        for role in policy.roles:
            if role.node != "worker-1":
                role.lms = [lm for lm in role.lms if lm != "lm1"]
        return Decision[MacroPolicy](agent="planner", policy=self.name, source="rule", value=policy)


def test_off_role_ratio_reaches_the_planner(ctx: ClusterContext) -> None:
    # Local routing keeps lm1 at all six origins, five of which are not lm1 nodes:
    # 5 of the 24 requests per slot are off-role.
    p = plugins(ctx, planner=Lm1OnWorker1Planner(), router=RecordingRouter())
    result, _ = run(ctx, p, slots=6)
    assert [e.off_role_ratio for e in result.epochs] == [pytest.approx(5 / 24, abs=1e-6)] * 2


def test_off_role_ratio_is_zero_when_routes_follow_roles(ctx: ClusterContext) -> None:
    result, _ = run(ctx, plugins(ctx, router=RecordingRouter()), slots=3)
    assert result.epochs[0].off_role_ratio == 0.0


class BacklogSeeingDeployer:
    """Records the backlog each node's deployer is shown; keeps everything off."""

    name = "backlog-seeing"

    def __init__(self) -> None:
        self.seen: dict[str, dict[str, int]] = {}

    def place(self, obs: NodeObservation) -> Decision[Placement]:
        self.seen[obs.node.name] = dict(obs.state.backlog)
        off = [LMPlacement(lm=s.name, mode="off", cpu_cores=0, vgpus=0) for s in obs.services]
        return Decision[Placement](
            agent="deployer",
            policy=self.name,
            source="rule",
            value=Placement(node=obs.node.name, lms=off),
            node=obs.node.name,
        )


def test_deployers_see_the_backlog_the_routing_just_created(ctx: ClusterContext) -> None:
    # The router sends every set to worker-6 (2 prompts per origin and LM, six origins),
    # and the backend's snapshot shows no queue: the deployers decide after routing
    # (paper Fig. 4, T2.7), so worker-6's deployer must see those 12 prompts per LM.
    deployer = BacklogSeeingDeployer()
    run(ctx, plugins(ctx, router=SelfCoveringRouter(), deployer=deployer), slots=1)
    assert deployer.seen["worker-6"] == dict.fromkeys(ctx.lm_names, 12)
    assert all(not b for n, b in deployer.seen.items() if n != "worker-6")


def test_routed_backlog_counts_prompts_per_serving_lm() -> None:
    from lmedge.api import Route
    from lmedge.controller.loop import routed_backlog

    snap = Snapshot(
        slot=3,
        time_s=90.0,
        nodes=[NodeState(name="w1", backlog={"lm1": 4}), NodeState(name="w2")],
    )
    routing = RoutingMap(
        routes=[
            Route(origin="a", lm="lm1", destination="w1"),
            Route(origin="b", lm="chat", destination="w1", model="lm2"),  # a request class
            Route(origin="c", lm="lm1", destination="gone"),  # no such node in the snapshot
        ]
    )
    arrivals = [
        Arrival(origin="a", lm="lm1", requests=1, prompts=3),
        Arrival(origin="b", lm="chat", requests=2, prompts=5),
        Arrival(origin="c", lm="lm1", requests=1, prompts=7),
        Arrival(origin="d", lm="lm1", requests=1, prompts=9),  # rejected / unrouted
    ]
    out = routed_backlog(snap, routing, arrivals)
    assert [n.backlog for n in out.nodes] == [{"lm1": 7, "lm2": 5}, {}]
    assert snap.nodes[0].backlog == {"lm1": 4}, "the snapshot itself is not changed"


def test_tally_routes_counts_requests_and_prompts_in_one_pass() -> None:
    from lmedge.api import Route
    from lmedge.controller.loop import tally_routes

    routing = RoutingMap(
        routes=[
            Route(origin="a", lm="lm1", destination="w1"),
            Route(origin="b", lm="chat", destination="w1", model="lm2"),
            Route(origin="c", lm="lm1", destination="w2"),
            Route(origin="e", lm="lm1", destination="w2"),
        ]
    )
    arrivals = [
        Arrival(origin="a", lm="lm1", requests=1, prompts=3),
        Arrival(origin="b", lm="chat", requests=2, prompts=5),
        Arrival(origin="a", lm="lm1", requests=2, prompts=4),
        Arrival(origin="c", lm="lm1", requests=1, prompts=0),  # requests, no prompts
        Arrival(origin="e", lm="lm1", requests=0, prompts=6),  # no requests: not counted
        Arrival(origin="d", lm="lm1", requests=1, prompts=9),  # unrouted
    ]
    tally = tally_routes(routing, arrivals)
    assert tally.requests == {("w1", "lm1"): 3, ("w1", "lm2"): 2, ("w2", "lm1"): 1}
    # w2 got requests but no prompts: its backlog gains no entry
    assert tally.prompts == {"w1": {"lm1": 7, "lm2": 5}}


# -- long runs, background planning, live changes ------------------------------------


class CountingPlanner:
    """The uniform policy, numbered by call (its rationale says which call made it)."""

    name = "counting"

    def __init__(self) -> None:
        self.calls = 0

    def plan(self, obs: PlanningObservation) -> Decision[MacroPolicy]:
        self.calls += 1
        value = uniform_macro_policy(obs.context).model_copy(update={"rationale": str(self.calls)})
        return Decision[MacroPolicy](agent="planner", policy=self.name, source="rule", value=value)


class MacroSeeingRouter:
    """Local routing that remembers the macro policy each slot saw."""

    name = "macro-seeing"

    def __init__(self) -> None:
        self.seen: list[str | None] = []

    def route(self, obs: SlotObservation) -> Decision[RoutingMap]:
        self.seen.append(obs.macro.rationale if obs.macro is not None else None)
        value = local_routing(obs.context, obs.arrivals)
        return Decision[RoutingMap](agent="scheduler", policy=self.name, source="rule", value=value)


class RecordingStore:
    """Takes what the loop hands to a store (the loop's only store calls)."""

    def __init__(self) -> None:
        self.records: list[RequestRecord] = []
        self.decisions: list[Decision[Any]] = []

    def record_requests(self, records: Sequence[RequestRecord]) -> None:
        self.records.extend(records)

    def record_decisions(self, decisions: Sequence[Decision[Any]]) -> None:
        self.decisions.extend(decisions)

    def record_telemetry(self, snapshots: Sequence[NodeTelemetry]) -> None:
        pass

    def record_memory(self, case: Any) -> None:
        pass


def test_a_run_without_history_keeps_nothing_per_request_but_stores_everything(
    ctx: ClusterContext,
) -> None:
    store: Any = RecordingStore()
    result, backend = run(ctx, plugins(ctx), slots=9, keep_history=False, store=store)
    assert result.records == [] and result.decisions == [] and result.timings == []
    assert result.placements == [] and result.actuations == []
    assert len(result.epochs) == 3, "epoch metrics are still computed"
    assert sum(e.requests for e in result.epochs) == len(store.records) > 0
    assert len(store.decisions) == 9 * (2 + len(ctx.workers)) - 6, "plan every 3rd slot"
    assert len(backend.applied) == 9 * len(ctx.workers), "every placement was actuated"


def test_a_run_with_history_keeps_it(ctx: ClusterContext) -> None:
    result, _ = run(ctx, plugins(ctx), slots=3)
    assert result.records and result.decisions and result.timings and result.placements


@pytest.mark.parametrize("lag", [0, 1, 2])
def test_background_planning_applies_at_a_defined_slot(ctx: ClusterContext, lag: int) -> None:
    # epoch_slots=3: plans at slots 0, 3, 6; each applies `lag` slots later
    router = MacroSeeingRouter()
    p = plugins(ctx, planner=CountingPlanner(), router=router)
    result, _ = run(ctx, p, slots=9, plan_lag_slots=lag)
    expected: list[str | None] = []
    current: str | None = None
    for slot in range(9):
        if slot >= lag and (slot - lag) % 3 == 0:
            current = str((slot - lag) // 3 + 1)
        expected.append(current)
    assert router.seen == expected
    plans = by_agent(result, "planner")
    assert [d.slot for d in plans] == [0, 3, 6], "stamped with the slot that asked"


def test_background_planning_without_a_lag_never_waits_for_the_planner(
    ctx: ClusterContext,
) -> None:
    import threading

    release = threading.Event()

    class SlowPlanner(CountingPlanner):
        def plan(self, obs: PlanningObservation) -> Decision[MacroPolicy]:
            release.wait(30)
            return super().plan(obs)

    router = MacroSeeingRouter()
    p = plugins(ctx, planner=SlowPlanner(), router=router)
    backend = StubBackend(ctx)
    loop = ControlLoop(backend, p, run_id="t", seed=1, background_planning=True)
    for slot in range(2):
        loop.step(slot)  # the planner is still blocked: the slots go on without a policy
    assert router.seen == [None, None]
    release.set()
    loop._planning._pending_plan.result(timeout=30)  # type: ignore[union-attr]
    loop.step(2)
    loop.close()
    assert router.seen == [None, None, "1"], "applied at the first slot after it was ready"


def test_a_cluster_change_replans_at_once_with_the_reason(ctx: ClusterContext) -> None:
    backend = StubBackend(ctx)
    backend.changes[1] = [ContextChange(kind="node_down", name="worker-2", detail="Node NotReady")]
    backend.changes[2] = [ContextChange(kind="link_changed", name="a->b")]
    planner = CountingPlanner()
    loop = ControlLoop(backend, plugins(ctx, planner=planner), run_id="t", seed=1)
    result = loop.run(3)
    plans = by_agent(result, "planner")
    assert [d.slot for d in plans] == [0, 1], "a link change needs no new plan"
    assert plans[0].trigger is None
    assert plans[1].trigger == "cluster changed: node_down worker-2: Node NotReady"


class ModesSeeingDeployer(BacklogSeeingDeployer):
    """Records the planned modes each node's deployer is shown; keeps everything off."""

    name = "modes-seeing"

    def __init__(self) -> None:
        super().__init__()
        self.modes: dict[str, dict[str, str]] = {}

    def place(self, obs: NodeObservation) -> Decision[Placement]:
        self.modes[obs.node.name] = dict(obs.modes)
        return super().place(obs)


def test_deployers_see_the_modes_the_rule_planner_sized(ctx: ClusterContext) -> None:
    # The agentic planner without an LLM is the rule: it sizes each role LM in a
    # mode (NodeRole.modes), and each node's deployer is shown its own.
    p = build_plugins(PolicyChoice("ma"), ctx, seed=1)
    deployer = ModesSeeingDeployer()
    p.deployers = dict.fromkeys(p.deployers, deployer)
    result, _ = run(ctx, p, slots=1)
    (plan,) = by_agent(result, "planner")
    planned = plan.value.mode_map()
    assert any(planned.values()), "the rule planner gives modes"
    assert deployer.modes == {n.name: planned.get(n.name, {}) for n in ctx.workers}
