"""Policy benchmarks (run by `make bench`): decision time per slot of the model-based plugins.

Two questions:

1. On the paper's testbed, does every policy decide within one slot (30 s)?
   A full slot: every worker an origin for every LM (24 batches) with queues
   and running instances, timed over several slots (router + every node's
   deployer), for lyapunov, perllm-ucb, milp, cema and lyreo.
2. At scale (1,000 workers x 16 LMs x 10,000 requests), how long does the
   deterministic part of a slot take for the cheap policies (perllm-ucb,
   lyreo routers; the lyapunov deployer on every node)?

Results are printed and written to reports/bench-policies.json.
"""

from __future__ import annotations

import json
import random
import statistics
import time
from pathlib import Path
from typing import Any

import pytest

from lmedge.api import (
    Arrival,
    ClusterContext,
    InstanceState,
    NodeObservation,
    NodeState,
    SlotObservation,
    Snapshot,
)
from lmedge.api.manifests import load_resources, parse_resources
from lmedge.controller.catalog import BuildContext, build_deployer, build_router
from lmedge.sim.synthetic import lm_service, synthetic_cluster

pytestmark = pytest.mark.bench

ROOT = Path(__file__).resolve().parents[1]
REPORT = ROOT / "reports" / "bench-policies.json"
RESULTS: dict[str, Any] = {}


def paper_testbed() -> ClusterContext:
    nodes, services = load_resources(ROOT / "examples" / "testbed")
    return ClusterContext(nodes=nodes, services=services)


def large(workers: int = 1000, lms: int = 16) -> ClusterContext:
    docs = [("synthetic", d) for d in synthetic_cluster(workers, sites=10)]
    for k in range(lms):
        gpu_only = k % 4 >= 2
        docs.append(
            (
                "synthetic",
                lm_service(
                    f"lm{k + 1}",
                    gpu_s=3.0 + k % 5,
                    cpu_s=None if gpu_only else 8.0 + k % 3,
                    runs_on="gpu-only" if gpu_only else "cpu-or-gpu",
                    memory_gib=2.0 + k % 3,
                    vram_gib=1.0 + k % 4,
                ),
            )
        )
    nodes, services = parse_resources(docs)
    return ClusterContext(nodes=nodes, services=services)


def observation(
    ctx: ClusterContext, requests: int, slot: int, rng: random.Random
) -> SlotObservation:
    """A busy slot: `requests` arrivals over distinct (origin, LM) pairs, queues, instances."""
    pairs = [(n.name, s) for n in ctx.workers for s in ctx.lm_names]
    chosen = pairs if requests >= len(pairs) else rng.sample(pairs, requests)
    arrivals = [Arrival(origin=o, lm=lm, requests=1, prompts=rng.randint(1, 8)) for o, lm in chosen]
    states = []
    for n in ctx.workers:
        running = rng.sample(ctx.lm_names, k=min(2, len(ctx.lm_names)))
        mode = "gpu" if n.spec.has_gpu else "cpu"
        instances = [
            InstanceState(
                lm=lm, mode=mode, cpu_cores=4, vgpus=1 if mode == "gpu" else 0, status="ready"
            )
            for lm in running
            if mode == "gpu" or ctx.service(lm).spec.runs_on == "cpu-or-gpu"
        ]
        backlog = {lm: rng.randint(0, 12) for lm in ctx.lm_names}
        states.append(NodeState(name=n.name, backlog=backlog, instances=instances))
    return SlotObservation(
        slot=slot,
        epoch=0,
        context=ctx,
        macro=None,
        snapshot=Snapshot(slot=slot, time_s=slot * ctx.slot_s, nodes=states),
        arrivals=arrivals,
    )


def node_observations(obs: SlotObservation) -> list[NodeObservation]:
    ctx = obs.context
    states = {s.name: s for s in obs.snapshot.nodes}
    return [
        NodeObservation(
            slot=obs.slot, epoch=0, node=n, services=ctx.services, roles=[], state=states[n.name]
        )
        for n in ctx.workers
    ]


ROUTER_DEPLOYER = [
    ("lyapunov", "local", "lyapunov"),
    ("perllm-ucb", "perllm-ucb", "lyapunov"),
    ("milp", "milp", "milp"),
    ("cema", "cema", "lyapunov"),
    ("lyreo", "lyreo", "lyapunov"),
]


@pytest.mark.parametrize(
    ("router", "deployer"), [r[1:] for r in ROUTER_DEPLOYER], ids=[r[0] for r in ROUTER_DEPLOYER]
)
def test_decision_time_per_slot_on_testbed(router: str, deployer: str) -> None:
    ctx = paper_testbed()
    rng = random.Random(7)
    r = build_router(router, BuildContext(ctx, 1))
    deployers = {n.name: build_deployer(deployer, BuildContext(ctx, 1)) for n in ctx.workers}
    times = []
    for slot in range(5):
        obs = observation(ctx, 24, slot, rng)
        started = time.perf_counter()
        r.route(obs)
        for nobs in node_observations(obs):
            deployers[nobs.node.name].place(nobs)
        times.append(time.perf_counter() - started)
    key = f"testbed/{router}+{deployer}"
    RESULTS[key] = {"mean_s": statistics.mean(times), "max_s": max(times), "slots": len(times)}
    print(
        f"\n{key}: mean {statistics.mean(times) * 1e3:.1f} ms, max {max(times) * 1e3:.1f} ms/slot"
    )
    assert max(times) < ctx.slot_s, "a policy must decide within one slot"


CHEAP = ["perllm-ucb", "lyreo", "lyapunov"]


@pytest.mark.parametrize("policy", CHEAP)
def test_slot_at_1000_workers_16_lms_10000_requests(policy: str) -> None:
    ctx = large()
    obs = observation(ctx, 10_000, 1, random.Random(3))
    started = time.perf_counter()
    if policy == "lyapunov":
        d = build_deployer(policy, BuildContext(ctx, 1))
        for nobs in node_observations(obs):
            d.place(nobs)
    else:
        build_router(policy, BuildContext(ctx, 1)).route(obs)
    took = time.perf_counter() - started
    RESULTS[f"scale/{policy}"] = {"seconds": took, "workers": 1000, "lms": 16, "requests": 10_000}
    print(f"\nscale {policy}: {took:.2f} s for 1,000 workers x 16 LMs x 10,000 requests")
    assert took < ctx.slot_s


def teardown_module() -> None:
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    previous = json.loads(REPORT.read_text()) if REPORT.exists() else {}
    REPORT.write_text(json.dumps(previous | RESULTS, indent=2, sort_keys=True) + "\n")
