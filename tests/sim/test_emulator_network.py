"""Uplink and downlink delays from payload size and link class."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from lmedge.backends.emulated import EmulatedBackend
from lmedge.sim import Scenario
from tests.sim.conftest import place, route, run_all

KIB = 8192  # bits


@pytest.mark.parametrize(
    ("origin", "uplink", "downlink"),
    [
        ("w1", 0.0, 0.0),
        ("w2", 0.0005 + 3 * 100 * KIB / 10e9, 0.0005 + 3 * 200 * KIB / 10e9),
        ("w3", 0.020 + 3 * 100 * KIB / 100e6, 0.020 + 3 * 200 * KIB / 100e6),
    ],
    ids=["local", "same-site", "cross-site"],
)
def test_transmission_delay_per_link_class(
    make_scenario: Callable[..., Scenario], origin: str, uplink: float, downlink: float
) -> None:
    # a: 100 KiB up and 200 KiB down per prompt; 3 prompts served on w1
    be = EmulatedBackend(make_scenario([(0, origin, "a", 3, 2.0)]), seed=0)
    place(be, "w1", ("a", "gpu", 4, 1))
    route(be, 0, (origin, "a", "w1"))
    (rec,) = run_all(be, 200)
    assert rec.destination == "w1"
    assert rec.uplink_s == pytest.approx(uplink, rel=1e-9, abs=1e-12)
    assert rec.downlink_s == pytest.approx(downlink, rel=1e-9, abs=1e-12)
    assert rec.latency_s == pytest.approx(uplink + 30.0 + downlink)
