"""The Lyapunov deployer's array-scored exhaustive search picks what the scalar scan picks."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest

from lmedge.api import ClusterContext
from lmedge.bench.runner import emulated_backend
from lmedge.bench.scale import scale_scenario
from lmedge.policies.lyapunov.deployer import LyapunovDeployer, LyapunovParams, _Scorer
from lmedge.sim import load_scenario
from tests.unit.policies.lyapunov.scenario import node_obs, paper_testbed


def _sixteen_lms(tmp: Path) -> ClusterContext:
    return emulated_backend(load_scenario(scale_scenario(tmp, 12, sites=2)), 1).context()


@pytest.mark.parametrize("utilization", ["observed", "action"])
@pytest.mark.parametrize("lms", [4, 16], ids=["testbed-4-lms", "scale-16-lms"])
def test_array_search_equals_the_scalar_scan(tmp_path: Path, utilization: str, lms: int) -> None:
    ctx = paper_testbed() if lms == 4 else _sixteen_lms(tmp_path)
    rng = random.Random(lms)
    compared = 0
    for trial in range(60):
        params = LyapunovParams(
            utilization=utilization,  # type: ignore[arg-type]
            vgpu_speedup=rng.choice([0.0, 0.5]),
            v=rng.choice([0.0, 1.0, 5.0]),
        )
        deployer = LyapunovDeployer(params)
        node = rng.choice(ctx.workers)
        names = ctx.lm_names
        backlog = {lm: rng.choice([0, 0, 1, 3, 40]) for lm in rng.sample(names, k=len(names) // 2)}
        running: dict[str, str] = {}
        if node.spec.has_gpu:
            running = {lm: "gpu" for lm in rng.sample(names, k=min(2, len(names)))}
        util = (rng.random(), rng.random(), rng.random())
        obs = node_obs(node.name, backlog, running, ctx, util=util)
        scorer = _Scorer(params, obs)
        choices = [deployer._options(obs.node, s, scorer, i) for i, s in enumerate(obs.services)]
        if math.prod(len(c) for c in choices) > params.max_enumeration:
            continue
        assert scorer.exhaustive_arrays(choices) == scorer.exhaustive_scan(choices), trial
        compared += math.prod(len(c) for c in choices) > 1
    assert compared >= 20
