"""LYREO router: workload metric, virtual queues, the nu trade-off, the learner seam."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from lmedge.api import NodeState, RequestRecord, SlotObservation, check_routing_map
from lmedge.errors import ConfigError
from lmedge.policies.lyreo import Candidate, LyreoLearner, NoLearner, build, workload
from tests.unit.policies.lyapunov.scenario import paper_testbed, slot_obs


def test_workload_is_memory_time_over_capacity() -> None:
    ctx = paper_testbed()
    state = NodeState(name="worker-2", backlog={"lm4": 6})
    spec = ctx.service("lm4").spec
    expected = 6 * spec.min_vram_gib * spec.profile.gpu_seconds_per_prompt / (24.0 * 30.0)
    assert workload(ctx, state) == pytest.approx(expected)
    cpu = NodeState(name="worker-1", backlog={"lm2": 2, "lm4": 9})  # lm4 cannot run there
    lm2 = ctx.service("lm2").spec
    assert workload(ctx, cpu) == pytest.approx(
        2 * lm2.min_memory_gib * lm2.profile.cpu_seconds_per_prompt / (32.0 * 30.0)
    )


@pytest.mark.parametrize(
    ("loads", "z0", "eps", "expected"),
    [
        ({"a": 1.0, "b": 1.0}, {"a": 0.0, "b": 0.0}, 0.01, {"a": 0.0, "b": 0.0}),
        ({"a": 2.0, "b": 0.0}, {"a": 0.0, "b": 0.0}, 0.5, {"a": 0.5, "b": 0.5}),
        ({"a": 1.0, "b": 1.0}, {"a": 0.3, "b": 0.0}, 0.1, {"a": 0.2, "b": 0.0}),
    ],
    ids=["balanced-stays-zero", "imbalance-accumulates", "drains-by-eps"],
)
def test_virtual_queue_update(
    loads: dict[str, float], z0: dict[str, float], eps: float, expected: dict[str, float]
) -> None:
    router = build(paper_testbed(), 0, {"epsilon": eps})
    router.z = dict(z0)
    router.update_queues(loads)
    assert router.z == pytest.approx(expected)


def test_low_nu_balances_and_high_nu_minimizes_latency() -> None:
    # Everything idle, one origin with many LM1 batches: latency alone keeps them local.
    arrivals = [("worker-3", "lm1", 8)]
    backlog = {n: {"lm1": 0} for n in ("worker-3",)}
    running = {n: {"lm1": "gpu"} for n in ("worker-2", "worker-3", "worker-4", "worker-5")}
    latency = build(paper_testbed(), 0, {"nu": 10.0})
    obs = slot_obs(arrivals, backlog, running)
    assert latency.route(obs).value.routes[0].destination == "worker-3"
    balance = build(paper_testbed(), 0, {"nu": 1e-4})
    balance.z = {n: 0.0 for n in balance.z} | {"worker-3": 50.0}  # worker-3 has been overloaded
    assert balance.route(obs).value.routes[0].destination != "worker-3"


def test_spreads_a_burst_over_nodes_and_stays_feasible() -> None:
    arrivals = [(f"worker-{k}", "lm3", 8) for k in range(1, 7)]
    running = {f"worker-{k}": {"lm3": "gpu"} for k in range(2, 7)}
    obs = slot_obs(arrivals, running=running)
    decision = build(paper_testbed(), 0, {}).route(obs)
    assert check_routing_map(decision.value, obs.context, obs.arrivals) == []
    assert len({r.destination for r in decision.value.routes}) >= 3


class SteeringLearner:
    """A stand-in learned policy: strongly prefers one node; records transitions."""

    def __init__(self, node: str) -> None:
        self.node = node
        self.transitions: list[tuple[int, str]] = []
        self.rewards: list[float] = []

    def bias(
        self, obs: SlotObservation, z: Mapping[str, float], b: int, cands: Sequence[Candidate]
    ) -> Sequence[float]:
        return [-100.0 if c.node == self.node else 0.0 for c in cands]

    def record(
        self,
        obs: SlotObservation,
        z: Mapping[str, float],
        b: int,
        cands: Sequence[Candidate],
        chosen: str,
    ) -> None:
        self.transitions.append((obs.slot, chosen))

    def observe(self, records: Sequence[RequestRecord]) -> None:
        self.rewards += [r.latency_s for r in records]


def test_learner_seam_biases_records_and_observes() -> None:
    learner = SteeringLearner("worker-6")
    assert isinstance(learner, LyreoLearner) and isinstance(NoLearner(), LyreoLearner)
    router = build(paper_testbed(), 0, {}, learner=learner)
    decision = router.route(slot_obs([("worker-1", "lm2", 3), ("worker-2", "lm4", 1)], slot=3))
    assert {r.destination for r in decision.value.routes} == {"worker-6"}
    assert learner.transitions == [(3, "worker-6"), (3, "worker-6")]
    router.observe(
        [
            RequestRecord(
                id="a",
                lm="lm2",
                origin="worker-1",
                destination="worker-6",
                prompts=3,
                slot=3,
                submit_s=90,
                inference_s=12.0,
                outcome="success",
            )
        ]
    )
    assert learner.rewards == [12.0]


@pytest.mark.parametrize("params", [{"nu": -1}, {"V": 1}], ids=["negative-nu", "unknown"])
def test_bad_params_are_rejected(params: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match="lyreo"):
        build(paper_testbed(), 0, params)
