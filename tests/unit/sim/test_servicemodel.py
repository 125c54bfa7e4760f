"""Service-rate formulas: f(eta), Amdahl scaling and time-sliced GPU shares."""

from __future__ import annotations

import pytest

from lmedge.sim.scenario import SlowdownSpec
from lmedge.sim.servicemodel import (
    amdahl,
    cpu_base_seconds,
    demand_rates,
    gpu_rate,
    lognormal_unit,
    slowdown,
)

NONE = SlowdownSpec(eta0=1.0, beta=0.0)


@pytest.mark.parametrize(
    ("eta", "expected"),
    [(0.0, 1.0), (0.7, 1.0), (0.9, 1 / 1.1), (1.0, 1 / 1.15)],
    ids=["idle", "at-knee", "above", "full"],
)
def test_slowdown(eta: float, expected: float) -> None:
    assert slowdown(SlowdownSpec(eta0=0.7, beta=0.5), eta) == pytest.approx(expected)


def test_amdahl_and_cpu_base_time() -> None:
    assert amdahl(1, 0.8) == pytest.approx(1.0)
    assert amdahl(4, 0.8) == pytest.approx(2.5)
    assert cpu_base_seconds(20.0, 4, 4, 0.8) == pytest.approx(20.0)
    assert cpu_base_seconds(20.0, 4, 8, 0.8) == pytest.approx(15.0)
    assert cpu_base_seconds(20.0, 4, 8, 0.0) == pytest.approx(20.0)  # serial: no gain


@pytest.mark.parametrize(
    ("binding", "busy_slots", "busy_pods", "rate"),
    [
        ([(0, 1)], [1], [1], 1.0),
        ([(0, 2)], [2], [1], 1.0),
        ([(0, 1)], [2], [2], 0.5),
        ([(0, 2)], [3], [2], 2 / 3),
        ([(0, 1), (1, 1)], [1, 1], [1, 1], 1.0),
        ([(0, 1), (1, 1)], [2, 1], [2, 1], 2 / 3),
    ],
    ids=[
        "alone-1",
        "alone-2-no-speedup",
        "shared-1-1",
        "shared-2-1",
        "split-alone",
        "split-one-shared",
    ],
)
def test_gpu_time_share(
    binding: list[tuple[int, int]], busy_slots: list[int], busy_pods: list[int], rate: float
) -> None:
    assert gpu_rate(binding, busy_slots, busy_pods, 4, NONE) == pytest.approx(rate)


def test_lognormal_unit_has_mean_one() -> None:
    import math

    mu, sigma = lognormal_unit(0.3)
    assert math.exp(mu + sigma**2 / 2) == pytest.approx(1.0)
    assert math.sqrt(math.exp(sigma**2) - 1) == pytest.approx(0.3)


@pytest.mark.parametrize(
    ("weights", "demands", "rates"),
    [
        ([1, 1], [1.0, 1.0], [0.5, 0.5]),
        ([2, 1], [1.0, 1.0], [2 / 3, 1 / 3]),
        ([1, 1], [0.3, 0.4], [1.0, 1.0]),
        ([1, 1], [0.3, 1.0], [1.0, 0.7]),
        ([1, 1], [0.6, 0.6], [0.5 / 0.6, 0.5 / 0.6]),
        ([1, 1, 1], [0.2, 0.9, 0.9], [1.0, 0.4 / 0.9, 0.4 / 0.9]),
        ([1], [0.5], [1.0]),
    ],
    ids=["full-equal", "full-weighted", "fits", "small-first", "both-over", "three", "alone"],
)
def test_demand_rates_share_the_gpu_max_min_fair(
    weights: list[float], demands: list[float], rates: list[float]
) -> None:
    assert demand_rates(weights, demands) == pytest.approx(rates)
