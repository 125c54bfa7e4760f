"""The no-queue lower bound of a request's latency (uplink + inference + downlink)."""

from __future__ import annotations

import pytest

from lmedge.api import ClusterContext, RequestRecord
from lmedge.api.records import RequestOutcome
from lmedge.sim.network import Network
from lmedge.sim.servicemodel import (
    _BoundTable,
    fastest_seconds_per_prompt,
    lower_bounds,
    no_queue_lower_bound,
)


def test_a_cpu_only_node_bounds_by_perfect_core_scaling(ctx: ClusterContext) -> None:
    # worker-1 has no GPU and 24 cores; lm2 profiles 30 s per prompt on its 4 default cores.
    lm2 = ctx.service("lm2").spec
    cores = ctx.node("worker-1").spec.cpu_cores
    expected = lm2.profile.cpu_seconds_per_prompt * lm2.default_cpu_cores / cores  # type: ignore[operator]
    assert fastest_seconds_per_prompt(ctx, "lm2", "worker-1") == pytest.approx(expected)
    assert fastest_seconds_per_prompt(ctx, "lm4", "worker-1") is None  # gpu-only
    assert fastest_seconds_per_prompt(ctx, "lm2", "worker-2") == lm2.profile.gpu_seconds_per_prompt


def test_the_bound_is_the_best_node_including_transfers(ctx: ClusterContext) -> None:
    net = Network(ctx.nodes)
    prof = ctx.service("lm4").spec.profile
    k = 3
    by_node = [
        net.delay("worker-1", n, k * prof.request_kib)
        + k * prof.gpu_seconds_per_prompt
        + net.delay(n, "worker-1", k * prof.response_kib)
        for n in ctx.feasible_nodes("lm4")
    ]
    bound = no_queue_lower_bound(ctx, net, "lm4", "worker-1", k)
    assert bound == pytest.approx(min(by_node))
    # worker-1 cannot run lm4, so the bound pays a transfer on top of inference.
    assert bound is not None and bound > k * prof.gpu_seconds_per_prompt
    # A local GPU node pays no transfer at all.
    assert no_queue_lower_bound(ctx, net, "lm4", "worker-2", k) == pytest.approx(
        k * prof.gpu_seconds_per_prompt
    )


def _rec(lm: str, origin: str, prompts: int, outcome: RequestOutcome) -> RequestRecord:
    return RequestRecord(
        id=f"{lm}-{origin}-{prompts}-{outcome}",
        lm=lm,
        origin=origin,
        destination=origin,
        prompts=prompts,
        slot=0,
        submit_s=0.0,
        outcome=outcome,
    )


def test_per_lm_bounds_average_the_successes_else_the_arrivals(ctx: ClusterContext) -> None:
    net = Network(ctx.nodes)
    records = [
        _rec("lm1", "worker-2", 2, "success"),
        _rec("lm1", "worker-2", 8, "timeout"),  # not in lm1's success-only mean
        _rec("lm3", "worker-3", 4, "timeout"),
    ]
    bounds = lower_bounds(ctx, records, ["lm1", "lm2", "lm3"])
    assert bounds["lm1"] == pytest.approx(no_queue_lower_bound(ctx, net, "lm1", "worker-2", 2))
    assert bounds["lm2"] is None  # no request at all
    assert bounds["lm3"] == pytest.approx(no_queue_lower_bound(ctx, net, "lm3", "worker-3", 4))


def test_the_tally_bounds_every_key_exactly_as_the_node_loop(ctx: ClusterContext) -> None:
    # The tally computes all nodes at once; it must give the very same floats.
    net = Network(ctx.nodes)
    table = _BoundTable(ctx)
    keys = [(lm, n.name, k) for lm in ctx.lm_names for n in ctx.nodes for k in (1, 2, 7)]
    assert [table.bound(*key) for key in keys] == [
        no_queue_lower_bound(ctx, net, *key) for key in keys
    ]
