"""The cold-start distribution matches the paper's median, p95 and maximum."""

from __future__ import annotations

import numpy as np
import pytest

from lmedge.sim.coldstart import fit_truncated_lognormal


def test_fit_hits_the_targets_exactly() -> None:
    d = fit_truncated_lognormal(9.34, 12.23, 13.58)
    assert d.quantile(0.5) == pytest.approx(9.34, abs=1e-9)
    assert d.quantile(0.95) == pytest.approx(12.23, abs=1e-9)
    assert d.quantile(1.0) == pytest.approx(13.58, rel=1e-6)


def test_samples_match_median_p95_and_never_exceed_the_max() -> None:
    d = fit_truncated_lognormal(9.34, 12.23, 13.58)
    rng = np.random.default_rng(0)
    x = np.array([d.sample(rng) for _ in range(20_000)])
    assert np.median(x) == pytest.approx(9.34, rel=0.01)
    assert np.quantile(x, 0.95) == pytest.approx(12.23, rel=0.01)
    assert x.max() <= 13.58 and x.max() > 13.0
    assert x.min() > 0


@pytest.mark.parametrize(
    ("median", "p95", "cap"),
    [(10, 9, 12), (9, 12, 11), (0, 1, 2)],
    ids=["p95-below-median", "max-below-p95", "zero-median"],
)
def test_rejects_unordered_targets(median: float, p95: float, cap: float) -> None:
    with pytest.raises(ValueError, match="need 0 < median"):
        fit_truncated_lognormal(median, p95, cap)
