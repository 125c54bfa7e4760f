"""LYREO's balance metrics: deviation Y, virtual queues Z, high-KV share (lmedge.metrics)."""

from __future__ import annotations

import pytest

from lmedge.metrics import load_balance_stats, load_deviations, next_virtual_queues

GB = 1e9


@pytest.mark.parametrize(
    ("loads", "want"),
    [
        ({"a": 0.2, "b": 0.0}, {"a": 0.1, "b": 0.1}),
        ({"a": 0.3, "b": 0.3, "c": 0.3}, {"a": 0.0, "b": 0.0, "c": 0.0}),
        ({}, {}),
    ],
    ids=["two-apart", "equal", "none"],
)
def test_deviation_is_distance_from_the_mean(
    loads: dict[str, float], want: dict[str, float]
) -> None:
    assert load_deviations(loads) == pytest.approx(want)


def test_virtual_queue_grows_by_excess_and_never_goes_negative() -> None:
    z = next_virtual_queues({"a": 0.05, "b": 0.0}, {"a": 0.02, "b": 0.005}, 0.01)
    assert z == pytest.approx({"a": 0.06, "b": 0.0})


def test_stats_over_slots() -> None:
    # server a holds 0.2 GB over slot 0 and 0.4 GB over slot 1, b holds nothing:
    # W_a = 0.2 then 0.4 (capacity 1 GB x 1 s), Y = 0.1 then 0.2 on each server
    samples = [
        {"a": (0.0, 0.95), "b": (0.0, 0.1)},
        {"a": (0.2 * GB, 0.5), "b": (0.0, 0.0)},
        {"a": (0.6 * GB, 0.0), "b": (0.0, 0.0)},
    ]
    got = load_balance_stats(samples, {"a": GB, "b": GB}, slot_s=1.0, epsilon=0.01)
    assert got.slots == 2
    assert got.mean_deviation == pytest.approx(0.15)
    # Z after slot 0: 0.09 each; after slot 1: 0.09 + 0.19 = 0.28 each
    assert got.mean_virtual_queue == pytest.approx((0.09 + 0.28) / 2)
    # one of four (server, slot-start) readings at >= 90% of its pool
    assert got.high_kv_share == pytest.approx(0.25)


def test_stats_need_two_readings() -> None:
    got = load_balance_stats([{"a": (0.0, 0.0)}], {"a": GB}, slot_s=1.0, epsilon=0.01)
    assert got.slots == 0 and got.mean_deviation is None and got.high_kv_share is None
