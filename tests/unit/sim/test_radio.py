"""The users' wireless uplink (lmedge.sim.radio)."""

from __future__ import annotations

import math

import pytest

from lmedge.sim.radio import RadioSpec, server_positions, uplink_s


def test_uplink_is_bits_over_the_shared_shannon_rate() -> None:
    radio = RadioSpec(
        bandwidth_hz=1e6, tx_power_w=0.1, noise_w=1e-13, path_loss_exponent=3.5, bits_per_token=16
    )
    t = uplink_s(radio, (0.0, 0.0), (100.0, 0.0), tokens=70, n=4)
    rate = 1e6 / 4 * math.log2(1 + 0.1 * 100**-3.5 / 1e-13)
    assert t == pytest.approx(70 * 16 / rate)
    # twice the requests on the server: half the band each, twice the time
    assert uplink_s(radio, (0.0, 0.0), (100.0, 0.0), 70, 8) == pytest.approx(2 * t)
    # farther: slower
    assert uplink_s(radio, (0.0, 0.0), (150.0, 0.0), 70, 4) > t


def test_servers_sit_on_a_grid_inside_the_area() -> None:
    at = server_positions([f"s{k}" for k in range(8)], 200.0)
    assert at["s0"] == pytest.approx((200 / 6, 200 / 6))  # 3 columns, 3 rows
    assert len(set(at.values())) == 8
    assert all(0 < x < 200 and 0 < y < 200 for x, y in at.values())
