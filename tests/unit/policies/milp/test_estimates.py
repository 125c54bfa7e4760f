"""Profile-based estimates: the vectorized link table agrees with the scalar transfer."""

from __future__ import annotations

import numpy as np
import pytest

from lmedge.api import NodeState
from lmedge.policies.milp.estimates import (
    COLD_START_S,
    LinkTable,
    backlog_s,
    modes_on,
    transfer_s,
)
from tests.unit.policies.lyapunov.scenario import node_obs, paper_testbed


@pytest.mark.parametrize("lm", ["lm1", "lm3", "lm4"])
def test_link_table_matches_scalar_transfer(lm: str) -> None:
    ctx = paper_testbed()
    table = LinkTable(ctx)
    idx = np.arange(len(table.workers))
    for origin in [n.name for n in ctx.nodes]:
        vec = table.transfer(origin, lm, 5, idx)
        scalar = [transfer_s(ctx, origin, w, lm, 5) for w in table.workers]
        assert vec == pytest.approx(scalar)


@pytest.mark.parametrize(
    ("node", "lm", "expected"),
    [
        ("worker-1", "lm1", ("cpu",)),
        ("worker-1", "lm4", ()),
        ("worker-2", "lm2", ("gpu", "cpu")),
        ("control", "lm1", ()),
    ],
    ids=["cpu-node", "gpu-only-on-cpu-node", "both", "control"],
)
def test_modes_on(node: str, lm: str, expected: tuple[str, ...]) -> None:
    ctx = paper_testbed()
    assert modes_on(ctx, node, lm) == expected
    assert modes_on(ctx, node, lm) == expected  # the second answer comes from the memo


def test_backlog_wait_adds_cold_start_only_when_not_running() -> None:
    ctx = paper_testbed()
    per = ctx.service("lm3").spec.profile.gpu_seconds_per_prompt
    running = node_obs("worker-2", {"lm3": 4}, {"lm3": "gpu"}).state
    assert backlog_s(ctx, running, "lm3") == pytest.approx(4 * per)
    idle = NodeState(name="worker-2", backlog={"lm3": 4})
    assert backlog_s(ctx, idle, "lm3") == pytest.approx(4 * per + COLD_START_S)
