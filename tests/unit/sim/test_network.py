"""Link classes and payload-driven delays."""

from __future__ import annotations

import pytest

from lmedge.api import EdgeNodeSpec, NodeInfo
from lmedge.sim.network import Network
from lmedge.sim.synthetic import edge_node


def _nodes() -> list[NodeInfo]:
    docs = [
        edge_node("x1", site="a", links=[("b", 1000, 2)]),
        edge_node("x2", site="a", intra_mbps=1000, intra_ms=1),
        edge_node("y1", site="b"),
    ]
    return [
        NodeInfo(name=d["metadata"]["name"], spec=EdgeNodeSpec.model_validate(d["spec"]))
        for d in docs
    ]


def test_local_is_free() -> None:
    assert Network(_nodes()).delay("x1", "x1", 1e6) == 0.0


def test_same_site_uses_the_senders_intra_site_link() -> None:
    net = Network(_nodes())
    assert net.delay("x1", "x2", 100) == pytest.approx(0.0005 + 100 * 8192 / 10e9)
    assert net.delay("x2", "x1", 100) == pytest.approx(0.001 + 100 * 8192 / 1e9)


def test_cross_site_uses_either_sides_link_or_the_site_table() -> None:
    net = Network(_nodes())
    expected = 0.002 + 500 * 8192 / 1e9
    assert net.delay("x1", "y1", 500) == pytest.approx(expected)  # x1's own link
    assert net.delay("y1", "x1", 500) == pytest.approx(expected)  # x1's link, backwards
    assert net.delay("x2", "y1", 500) == pytest.approx(expected)  # site a's link
    assert net.distance("x1", "x1") < net.distance("x1", "x2") < net.distance("x1", "y1")
