"""Invariants under churn: Q_ni is exact, and every prompt runs exactly once."""

from __future__ import annotations

import random
from pathlib import Path

from lmedge.api import LMPlacement, Placement, Route, RoutingMap, nearest_feasible
from lmedge.backends.emulated import EmulatedBackend, load_scenario
from lmedge.sim.engine import Emulator
from lmedge.sim.entities import QUEUED

TESTBED = Path(__file__).parents[2] / "examples" / "testbed"
OFF = {"min": 0, "max": 0}


def _scan_backlog(em: Emulator) -> dict[tuple[str, str], int]:
    out = {}
    for node in em.nodes.values():
        for lm, q in node.queues.items():
            total = sum(j.prompts - j.done for j in q if j.state == QUEUED)
            inst = node.instances.get(lm)
            if inst is not None and inst.job is not None:
                total += inst.job.prompts - inst.job.done
            out[(node.name, lm)] = total
    return out


def test_backlog_and_prompt_conservation_under_random_churn() -> None:
    lms = ["lm1", "lm2", "lm3", "lm4"]
    sc = load_scenario(
        TESTBED,
        loop={"tau_s": 300},
        workload={
            "phases": [
                {"name": "on", "slots": 40},
                {"name": "quiet", "slots": 1, "prompts": dict.fromkeys(lms, OFF)},
            ]
        },
    )
    be = EmulatedBackend(sc, seed=11)
    ctx = be.context()
    rng = random.Random(11)
    records = []
    for t in range(60):
        snap = be.snapshot(t)
        assert {(n.name, lm): q for n in snap.nodes for lm, q in n.backlog.items()} == (
            _scan_backlog(be.emulator)
        )
        routes = [
            Route(origin=a.origin, lm=a.lm, destination=rng.choice(ctx.feasible_nodes(a.lm)))
            for a in be.arrivals(t)
        ]
        be.publish_routing(t, RoutingMap(routes=routes))
        for n in ctx.workers:
            lms_on = [
                LMPlacement(
                    lm=lm,
                    mode=rng.choice(["gpu", "cpu", "off"]),
                    cpu_cores=rng.choice([2, 4, 8]),
                    vgpus=rng.choice([1, 2]),
                )
                for lm in lms
            ]
            fixed = [
                p if p.mode != "off" else LMPlacement(lm=p.lm, mode="off", cpu_cores=0, vgpus=0)
                for p in lms_on
            ]
            be.apply_placement(nearest_feasible(Placement(node=n.name, lms=fixed), n, ctx.services))
        # advance in uneven steps so stops land mid-prompt
        be.clock.sleep_until(t * 30 + rng.uniform(1, 29))
        be.clock.sleep_until((t + 1) * 30)
        records.extend(be.drain_records())
    be.clock.sleep_until(60 * 30 + 400)
    records.extend(be.drain_records())
    stats = be.emulator.stats
    assert stats["submitted"] == len(records) == len({r.id for r in records}) > 500
    assert stats["prompts_lost"] > 0  # the churn did interrupt prompts
    assert stats["prompts_done"] == sum(r.prompts_done for r in records)
    assert all(r.prompts_done == r.prompts for r in records if r.outcome == "success")
    assert all(r.prompts_done <= r.prompts for r in records)
    assert all(abs(r.latency_s - 300) < 1e-6 for r in records if r.outcome == "timeout")
    assert all(r.latency_s <= 300 + 1e-6 for r in records)
    assert all(v == 0 for v in _scan_backlog(be.emulator).values())


def test_queues_of_an_lm_that_never_comes_back_stay_bounded() -> None:
    sc = load_scenario(TESTBED, loop={"tau_s": 60})
    be = EmulatedBackend(sc, seed=1)
    for t in range(100):
        routes = [Route(origin=a.origin, lm=a.lm, destination="worker-6") for a in be.arrivals(t)]
        be.publish_routing(t, RoutingMap(routes=routes))
        be.clock.sleep_until((t + 1) * 30)
    queues = be.emulator.nodes["worker-6"].queues
    # at most the sets of the last tau = 2 slots from 6 origins wait, expired ones are gone
    assert all(len(q) <= 2 * 6 + 1 for q in queues.values())
    assert len(be.drain_records()) > 1000
