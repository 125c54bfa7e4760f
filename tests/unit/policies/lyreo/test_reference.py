"""The compiled LYREO greedy routes as its formulas say, written out plainly here.

The reference below is the router module's docstring in per-node Python over the
public estimates (`workload`, `serving_mode`, `service_s`, `transfer_s`), so it
shares none of the router's caches, flat arrays or kernel.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from lmedge.api import ClusterContext, NodeState, SlotObservation
from lmedge.api.constants import COLD_START_S
from lmedge.api.manifests import load_resources
from lmedge.bench.runner import resolve_scenario
from lmedge.bench.scale import scale_scenario
from lmedge.policies.kit.estimates import service_s, serving_mode, transfer_s
from lmedge.policies.lyreo import Candidate, build, workload
from lmedge.policies.lyreo.router import memory_per_prompt
from tests.unit.policies.lyapunov.scenario import slot_obs


def _context(path: Path) -> ClusterContext:
    nodes, _ = load_resources(path / "nodes.yaml")
    _, services = load_resources(path / "services.yaml")
    return ClusterContext(nodes=nodes, services=services)


def reference(
    ctx: ClusterContext, obs: SlotObservation, z0: dict[str, float], nu: float, eps: float
) -> dict[tuple[str, str], str]:
    """(origin, LM) -> destination, by the docstring's greedy."""
    workers = [n.name for n in ctx.workers]
    states = {s.name: s for s in obs.snapshot.nodes}
    state = {n: states.get(n, NodeState(name=n)) for n in workers}
    loads = {n: workload(ctx, state[n]) for n in workers}
    mean0 = sum(loads.values()) / len(workers)
    z = {n: max(z0[n] + abs(loads[n] - mean0) - eps, 0.0) for n in workers}
    wait: dict[tuple[str, str], float] = {}
    per: dict[tuple[str, str], float] = {}
    for lm in ctx.lm_names:
        for n in ctx.feasible_nodes(lm):
            mode, running = serving_mode(ctx, state[n], lm)
            per[n, lm] = t = service_s(ctx, lm, mode)
            wait[n, lm] = state[n].backlog.get(lm, 0) * t + (0.0 if running else COLD_START_S)
    total = math.fsum(loads.values())
    batches = sorted(
        (k for k, a in enumerate(obs.arrivals) if ctx.feasible_nodes(a.lm)),
        key=lambda k: (-obs.arrivals[k].prompts, k),
    )
    out = {}
    for k in batches:
        a = obs.arrivals[k]
        p, size = max(a.prompts, 1), len(workers)
        mean = total / size
        pull = sum(z[n] * ((loads[n] > mean) - (loads[n] < mean)) for n in workers)
        best: tuple[float, str, float] | None = None
        for n in ctx.feasible_nodes(a.lm):
            latency = (
                transfer_s(ctx, a.origin, n, a.lm, p) + wait[n, a.lm] + per[n, a.lm] * (p + 1) / 2
            )
            mem, cap = memory_per_prompt(ctx, n, a.lm)
            delta = p * (mem * per[n, a.lm] / (cap * ctx.loop.slot_s))
            shift = delta / size
            w = loads[n]
            sign = (w > mean) - (w < mean)
            own = abs(w + delta - mean - shift) - abs(w - mean)
            balance = z[n] * own - shift * (pull - z[n] * sign)
            score = nu * p * latency / ctx.deadline_s(a.lm) + balance
            if best is None or score < best[0]:
                best = (score, n, delta)
        assert best is not None
        _, node, delta = best
        out[a.origin, a.lm] = node
        loads[node] += delta
        total += delta
        wait[node, a.lm] += p * per[node, a.lm]
    return out


def random_slot(ctx: ClusterContext, rng: random.Random) -> SlotObservation:
    workers = [n.name for n in ctx.workers]
    lms = ctx.lm_names
    backlog = {n: {lm: rng.choice([0, 0, 1, 3, 8]) for lm in lms} for n in workers}
    running = {  # ready instances on half the GPU workers, where the LM fits
        n: {lm: "gpu" for lm in rng.sample(lms, 2) if n in ctx.feasible_nodes(lm)}
        for n in rng.sample(workers, len(workers) // 2)
        if ctx.node(n).spec.has_gpu
    }
    pairs = {
        (o, lm) for o in rng.sample(workers, min(len(workers), 12)) for lm in rng.sample(lms, 3)
    }
    arrivals = [(o, lm, rng.randint(1, 9)) for o, lm in sorted(pairs)]
    return slot_obs(arrivals, backlog, running, ctx=ctx)


class ZeroLearner:
    """A learner that adds nothing: the router takes its per-batch (learner) path."""

    def __init__(self) -> None:
        self.seen = 0

    def bias(self, obs: Any, z: Any, b: int, cands: Sequence[Candidate]) -> list[float]:
        self.seen += 1
        return [0.0] * len(cands)

    def record(self, *_args: Any) -> None:
        pass

    def observe(self, records: Any) -> None:
        pass


@pytest.mark.parametrize("learner", [False, True], ids=["compiled-path", "learner-path"])
@pytest.mark.parametrize("scenario", ["testbed", "large", "scale-60"])
@pytest.mark.parametrize("nu", [0.5, 0.01])
def test_routes_equal_the_plain_greedy(
    tmp_path: Path, scenario: str, nu: float, learner: bool
) -> None:
    path = (
        scale_scenario(tmp_path, 60, sites=5)
        if scenario == "scale-60"
        else resolve_scenario(scenario)
    )
    ctx = _context(path)
    rng = random.Random(f"{scenario}-{nu}")
    zero = ZeroLearner() if learner else None
    router = build(ctx, 0, {"nu": nu}, learner=zero)
    spread = set()
    for _ in range(3):  # across slots, so the virtual queues carry over
        z0 = dict(router.z)
        obs = random_slot(ctx, rng)
        got = {(r.origin, r.lm): r.destination for r in router.route(obs).value.routes}
        assert got == reference(ctx, obs, z0, nu, router.p.epsilon)
        assert router.z == pytest.approx(reference_z(ctx, obs, z0, router.p.epsilon))
        spread |= {d for (o, _), d in got.items() if d != o}
    assert len(spread) > 1  # requests were sent away from their origins, to several nodes
    assert zero is None or zero.seen > 0


def reference_z(
    ctx: ClusterContext, obs: SlotObservation, z0: dict[str, float], eps: float
) -> dict[str, float]:
    states = {s.name: s for s in obs.snapshot.nodes}
    loads = {n.name: workload(ctx, states.get(n.name, NodeState(name=n.name))) for n in ctx.workers}
    mean = sum(loads.values()) / len(loads)
    return {n: max(z0[n] + abs(w - mean) - eps, 0.0) for n, w in loads.items()}


@pytest.mark.parametrize(
    ("scores", "expected"),
    [
        ([3.0, 1.0, 1.0, 2.0], 1),  # ties: the first
        ([math.nan, math.inf, 3.0, 2.0], 3),  # not finite: never preferred
        ([math.nan, math.nan], 0),  # nothing finite: the first candidate
    ],
    ids=["first-of-ties", "skips-non-finite", "none-finite"],
)
def test_first_min(scores: list[float], expected: int) -> None:
    from lmedge.policies.lyreo.kernel import first_min

    assert first_min(np.array([*scores, -1.0]), len(scores)) == expected  # only the first m count
