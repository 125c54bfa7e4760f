"""NearestHosts answers what nearest_feasible_node answers, for every origin and LM."""

from __future__ import annotations

from pathlib import Path

import pytest

from lmedge.api import ClusterContext
from lmedge.api.manifests import load_resources
from lmedge.bench.runner import resolve_scenario
from lmedge.bench.scale import scale_scenario
from lmedge.policies.kit.support import NearestHosts, nearest_feasible_node


def _context(path: Path) -> ClusterContext:
    nodes, _ = load_resources(path / "nodes.yaml")
    _, services = load_resources(path / "services.yaml")
    return ClusterContext(nodes=nodes, services=services)


@pytest.mark.parametrize("scenario", ["testbed", "large", "scale-60"])
def test_nearest_hosts_equals_the_scan(tmp_path: Path, scenario: str) -> None:
    if scenario == "scale-60":
        # sites interleaved by name, 16 LMs (some fit only GPU nodes, so CPU-only origins
        # look elsewhere), and origins that name no link (an unlinked site is "other")
        path = scale_scenario(tmp_path, 60, sites=5)
    else:
        path = resolve_scenario(scenario)
    ctx = _context(path)
    nearest = NearestHosts(ctx)
    away = 0
    for lm in ctx.lm_names:
        for origin in [n.name for n in ctx.nodes] + ["not-a-node"]:
            want = nearest_feasible_node(ctx, origin, lm)
            assert nearest(origin, lm) == want, (origin, lm)
            away += want is not None and want != origin
    assert away > 0  # some origins are served elsewhere, so the link classes are compared
