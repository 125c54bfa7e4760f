"""LYREO's trained policy (run by `make bench`): loading it, and deciding a slot with it.

Budgets (issue 26): loading a policy adds at most 1 s to start-up; a slot of
a few hundred requests costs at most 20 ms to decide. The policy is a full-size
actor (the default width, as `lmedge train lyreo` writes), with random weights: the
time does not depend on what it learned. The slot is the seed's setting
(`examples/lyreo`: 8 servers of one LM) with 300 requests (five slots' users),
every request a decision over the 8 servers, each scored by the actor.
A slot's time is the process's CPU time: on a shared machine the wall clock
also counts the other processes (both are reported). Results are printed
and added to reports/bench-policies.json.
"""

from __future__ import annotations

import itertools
import json
import statistics
import time
from pathlib import Path

import numpy as np
import pytest

from lmedge.api import RequestRouter, SlotObservation
from lmedge.backends.emulated import EmulatedBackend
from lmedge.controller.catalog import BuildContext, build_router
from lmedge.policies.lyreo.learning import (
    FEATURES,
    LearnerParams,
    PolicyFile,
    Provenance,
    save_policy,
)
from lmedge.policies.lyreo.learning.actor import Layer
from lmedge.sim import load_scenario
from tests.unit.policies.lyapunov.scenario import slot_obs
from tests.unit.policies.lyreo.windows import window_of

pytestmark = pytest.mark.bench

ROOT = Path(__file__).resolve().parents[1]
REPORT = ROOT / "reports" / "bench-policies.json"


def observations(requests: int, slots: int) -> list[SlotObservation]:
    """`slots` busy slots of examples/lyreo, `requests` arrivals each, every server running."""
    backend = EmulatedBackend(load_scenario(ROOT / "examples" / "lyreo"), seed=1)
    ctx = backend.context()
    running = {n.name: {lm: "gpu" for lm in ctx.lm_names} for n in ctx.workers}
    out, t = [], 0
    for slot in range(slots):
        arrivals = []
        while len(arrivals) < requests:
            arrivals += backend.arrivals(t)
            t += 1
        obs = slot_obs([], running=running, ctx=ctx, slot=slot)
        out.append(obs.model_copy(update={"arrivals": arrivals[:requests]}))
    return out


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
            scenario="bench",
            seed=0,
            episodes=0,
            selected=0,
            slots=1,
            commit="bench",
            lmedge_version="0",
        ),
    )
    save_policy(policy, path)
    return path


def test_load_and_decide_a_slot_of_300_requests(tmp_path: Path) -> None:
    path = full_size_policy(tmp_path / "lyreo.json")
    slots = [window_of(obs) for obs in observations(300, 6)]
    ctx = slots[0].context
    # What the greedy already costs at its first slot is paid first: the figures
    # are what a policy adds (its file, its compiled kernel). A slot is one
    # window of its requests, each decided by the actor (`route_requests`).
    greedy = build_router("lyreo", BuildContext(ctx, 1, {"policy": "none"}))
    assert isinstance(greedy, RequestRouter)
    greedy.route_requests(slots[0])
    started = time.perf_counter()
    router = build_router("lyreo", BuildContext(ctx, 1, {"policy": str(path)}))
    load_s = time.perf_counter() - started
    assert isinstance(router, RequestRouter)
    started = time.perf_counter()
    router.route_requests(slots[0])  # the first slot also loads the compiled kernel
    first_s = time.perf_counter() - started
    times, walls = [], []
    for w in slots[1:]:
        started, cpu = time.perf_counter(), time.process_time()
        routes = router.route_requests(w)
        assert len(routes) == len(w.requests)
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
