"""A run's request-level routing windows folded into `WindowTotals` (lmedge.metrics)."""

from __future__ import annotations

from typing import Literal

import pytest

from lmedge.api.decisions import WindowAudit
from lmedge.metrics import window_totals


def audit(
    used: Literal["router", "seed", "map"],
    requests: int,
    wait_s: float,
    j: float | None = None,
    **terms: float,
) -> WindowAudit:
    return WindowAudit(
        start_s=0.0, end_s=1.0, requests=requests, used=used, wait_s=wait_s, j=j, **terms
    )


def test_terms_are_over_the_windows_that_report_them_and_counts_over_all() -> None:
    audits = [
        audit(
            "router",
            4,
            0.002,
            0.3,
            seed_j=0.5,
            quality_loss=0.1,
            cost=1.0,
            energy=10.0,
            makespan=2.0,
        ),
        audit(
            "router",
            2,
            0.004,
            0.5,
            seed_j=0.5,
            quality_loss=0.3,
            cost=2.0,
            energy=30.0,
            makespan=4.0,
        ),
        audit("seed", 3, 0.300),  # the router was slow: the seed routed it, no terms
    ]
    t = window_totals(audits)
    assert t is not None
    assert (t.windows, t.requests, t.fallbacks, t.reported) == (3, 9, 1, 2)
    assert t.decision_s_mean == pytest.approx(0.306 / 3)
    assert (t.j_mean, t.seed_j_mean, t.quality_loss_mean) == pytest.approx((0.4, 0.5, 0.2))
    assert (t.cost, t.energy_j, t.makespan_s_mean) == pytest.approx((3.0, 40.0, 3.0))


def test_windows_without_terms_leave_them_unmeasured() -> None:
    t = window_totals([audit("router", 5, 0.001), audit("map", 1, 0.0)])
    assert t is not None and (t.windows, t.fallbacks, t.reported) == (2, 1, 0)
    assert t.j_mean is None and t.cost is None and t.energy_j is None


def test_no_window_is_no_totals() -> None:
    assert window_totals([]) is None
