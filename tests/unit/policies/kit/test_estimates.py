"""Profile-based estimates: the vectorized link table agrees with the scalar transfer."""

from __future__ import annotations

import random

import numpy as np
import pytest

from lmedge.api import ClusterContext, NodeState
from lmedge.api.constants import COLD_START_S
from lmedge.api.manifests import load_resources
from lmedge.bench.runner import resolve_scenario
from lmedge.policies.kit.estimates import (
    LinkTable,
    Transfers,
    allowed_modes,
    backlog_s,
    link_arrays,
    transfer_bits,
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
def test_context_modes(node: str, lm: str, expected: tuple[str, ...]) -> None:
    ctx = paper_testbed()
    assert ctx.modes(node, lm) == expected
    assert ctx.modes(node, lm) == expected  # the second answer comes from the memo


def test_backlog_wait_adds_cold_start_only_when_not_running() -> None:
    ctx = paper_testbed()
    per = ctx.service("lm3").spec.profile.gpu_seconds_per_prompt
    running = node_obs("worker-2", {"lm3": 4}, {"lm3": "gpu"}).state
    assert backlog_s(ctx, running, "lm3") == pytest.approx(4 * per)
    idle = NodeState(name="worker-2", backlog={"lm3": 4})
    assert backlog_s(ctx, idle, "lm3") == pytest.approx(4 * per + COLD_START_S)


@pytest.mark.parametrize("scenario", ["testbed", "large"])
def test_transfers_and_link_arrays_equal_transfer_s_exactly(scenario: str) -> None:
    nodes, _ = load_resources(resolve_scenario(scenario) / "nodes.yaml")
    _, services = load_resources(resolve_scenario(scenario) / "services.yaml")
    ctx = ClusterContext(nodes=nodes, services=services)
    dests = [n.name for n in ctx.workers]
    sites = {ctx.node(n).spec.site for n in dests}
    for origin in [n.name for n in ctx.nodes] + ["not-a-node"]:
        for lm in ctx.lm_names[:3]:
            for prompts in (1, 7):
                want = [transfer_s(ctx, origin, d, lm, prompts) for d in dests]
                transfer = Transfers(ctx, origin, lm, prompts)
                assert [transfer.to(d) for d in dests] == want
                lat2, bw = link_arrays(ctx, origin, dests)
                assert (lat2 + transfer_bits(ctx, lm, prompts) / bw).tolist() == want
    assert scenario == "testbed" or len(sites) > 1  # cross-site links are compared too


def test_allowed_modes_is_context_modes_filtered() -> None:
    ctx = paper_testbed()
    for cpu_modes in (True, False):
        table = allowed_modes(ctx, cpu_modes)
        for n in ctx.workers:
            for lm in ctx.lm_names:
                ms = ctx.modes(n.name, lm)
                want = ms if cpu_modes else tuple(m for m in ms if m == "gpu")
                assert table[n.name, lm] == want
    assert allowed_modes(ctx, False)["worker-2", "lm2"] == ("gpu",)


@pytest.mark.parametrize("seed", range(3))
def test_link_arrays_follow_links_that_differ_node_by_node(seed: int) -> None:
    """Own intra-site links, declared links to some sites, none to others (the
    receiver's or the default applies): link_arrays equals transfer_s exactly."""
    from tests.unit.policies.milp.test_greedy_kernel import slow_links

    ctx = slow_links(random.Random(seed))
    dests = [n.name for n in ctx.workers]
    lm = ctx.lm_names[0]
    for origin in [n.name for n in ctx.nodes]:
        lat2, bw = link_arrays(ctx, origin, dests)
        want = [transfer_s(ctx, origin, d, lm, 3) for d in dests]
        assert (lat2 + transfer_bits(ctx, lm, 3) / bw).tolist() == want
