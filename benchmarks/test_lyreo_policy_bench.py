"""LYREO's trained policy (run by `make bench`): loading it, and deciding a slot with it.

Budgets (issue 26): loading a policy adds at most 1 s to start-up; a slot of
a few hundred requests costs at most 20 ms to decide. The policy is a full-size
actor (the default width, as `lmedge train lyreo` writes), with random weights: the
time does not depend on what it learned. The slot is the seed's size: 8
servers, 300 requests (one per (origin, LM) pair of 8 workers x 38 LMs, so
every request is a decision over up to 8 candidates, each scored by the actor).
A slot's time is the process's CPU time: on a shared machine the wall clock
also counts the other processes (both are reported). Results are printed
and added to reports/bench-policies.json.
"""

from __future__ import annotations

import itertools
import json
import random
import statistics
import time
from pathlib import Path

import numpy as np
import pytest

from benchmarks.test_policies_bench import large
from lmedge.api import Arrival, ClusterContext, InstanceState, NodeState, SlotObservation, Snapshot
from lmedge.controller.catalog import BuildContext, build_router
from lmedge.policies.lyreo.learning import (
    FEATURES,
    LearnerParams,
    PolicyFile,
    Provenance,
    save_policy,
)
from lmedge.policies.lyreo.learning.actor import Layer

pytestmark = pytest.mark.bench

REPORT = Path(__file__).resolve().parents[1] / "reports" / "bench-policies.json"


def observation(
    ctx: ClusterContext, requests: int, slot: int, rng: random.Random
) -> SlotObservation:
    """A busy slot: `requests` arrivals over distinct (origin, LM) pairs, queues, instances."""
    pairs = rng.sample([(n.name, s) for n in ctx.workers for s in ctx.lm_names], requests)
    arrivals = [Arrival(origin=o, lm=lm, requests=1, prompts=rng.randint(1, 8)) for o, lm in pairs]
    states = []
    for n in ctx.workers:
        mode = "gpu" if n.spec.has_gpu else "cpu"
        instances = [
            InstanceState(
                lm=lm, mode=mode, cpu_cores=4, vgpus=1 if mode == "gpu" else 0, status="ready"
            )
            for lm in rng.sample(ctx.lm_names, k=min(2, len(ctx.lm_names)))
            if mode == "gpu" or ctx.service(lm).spec.runs_on == "cpu-or-gpu"
        ]
        backlog = {lm: rng.randint(0, 12) for lm in ctx.lm_names}
        states.append(NodeState(name=n.name, backlog=backlog, instances=instances))
    return SlotObservation(
        slot=slot,
        epoch=0,
        context=ctx,
        macro=None,
        snapshot=Snapshot(slot=slot, time_s=slot * ctx.loop.slot_s, nodes=states),
        arrivals=arrivals,
    )


def full_size_policy(path: Path) -> Path:
    rng = np.random.default_rng(0)
    width = LearnerParams().hidden
    sizes = [len(FEATURES), width, width, 1]
    layers = [
        Layer(weight=rng.normal(0, 0.3, size=(a, b)).tolist(), bias=np.zeros(b).tolist())
        for a, b in itertools.pairwise(sizes)
    ]
    policy = PolicyFile(
        variant="lyreo",
        features=list(FEATURES),
        params=LearnerParams(),
        actor=layers,
        provenance=Provenance(
            scenario="bench", seed=0, episodes=0, slots=1, commit="bench", lmedge_version="0"
        ),
    )
    save_policy(policy, path)
    return path


def test_load_and_decide_a_slot_of_300_requests(tmp_path: Path) -> None:
    path = full_size_policy(tmp_path / "lyreo.json")
    ctx = large(workers=8, lms=38)
    rng = random.Random(5)
    observations = [observation(ctx, 300, slot, rng) for slot in range(6)]
    # What the greedy `lyreo` already costs at start-up (numba, the router's kernel) is
    # paid first: the figures are what a policy adds (its file, its compiled kernels).
    build_router("lyreo", BuildContext(ctx, 1, {"policy": "none"})).route(observations[0])
    started = time.perf_counter()
    router = build_router("lyreo", BuildContext(ctx, 1, {"policy": str(path)}))
    load_s = time.perf_counter() - started
    started = time.perf_counter()
    router.route(observations[0])  # the first slot also loads the compiled kernels
    first_s = time.perf_counter() - started
    times, walls = [], []
    for obs in observations[1:]:
        started, cpu = time.perf_counter(), time.process_time()
        router.route(obs)
        times.append(time.process_time() - cpu)
        walls.append(time.perf_counter() - started)
    result = {
        "load_s": load_s,
        "first_slot_s": first_s,
        "slot_median_s": statistics.median(times),
        "slot_max_s": max(times),
        "slot_wall_median_s": statistics.median(walls),
        "requests": 300,
        "workers": 8,
    }
    print(
        f"\nlyreo policy: load {load_s * 1e3:.0f} ms (router build included), first slot "
        f"{first_s * 1e3:.0f} ms (kernels loaded), slot of 300 "
        f"requests median {result['slot_median_s'] * 1e3:.1f} ms CPU, "
        f"max {max(times) * 1e3:.1f} ms, "
        f"wall median {result['slot_wall_median_s'] * 1e3:.1f} ms"
    )
    previous = json.loads(REPORT.read_text()) if REPORT.exists() else {}
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    REPORT.write_text(json.dumps(previous | {"lyreo-policy": result}, indent=2) + "\n")
    assert load_s + first_s <= 1.0
    assert result["slot_median_s"] <= 0.020
