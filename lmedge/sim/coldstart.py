"""Cold-start delays: a lognormal truncated at the observed maximum.

The paper (§V-D) measured 80 pod starts (pod creation + model load until the
first inference): median 9.34 s, p95 12.23 s, max 13.58 s. We fit a lognormal
whose *truncated* distribution (cut at the maximum) has exactly that median and
p95, and sample it by inverse CDF, so each sample costs one uniform draw and
never exceeds the maximum. This module does not decide when a pod starts; the
engine does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

_STD = NormalDist()


@dataclass(frozen=True)
class TruncatedLognormal:
    """ln X ~ N(mu, sigma^2), conditioned on X <= cap."""

    mu: float
    sigma: float
    cap: float

    @property
    def _p_cap(self) -> float:
        return _STD.cdf((math.log(self.cap) - self.mu) / self.sigma)

    def quantile(self, q: float) -> float:
        """The q-quantile of the truncated distribution."""
        p = min(max(q * self._p_cap, 1e-12), 1 - 1e-12)
        return math.exp(self.mu + self.sigma * _STD.inv_cdf(p))

    def sample(self, rng: np.random.Generator) -> float:
        return self.quantile(float(rng.random()))


def fit_truncated_lognormal(median: float, p95: float, cap: float) -> TruncatedLognormal:
    """Lognormal parameters whose truncation at `cap` has this median and p95.

    Fixed-point iteration: start from the untruncated fit and correct the two
    target probabilities by the mass above the cap; converges in a few steps
    because the truncated mass is small (about 1% for the paper's figures).
    """
    if not 0 < median < p95 < cap:
        raise ValueError(f"need 0 < median ({median}) < p95 ({p95}) < max ({cap})")
    z95 = _STD.inv_cdf(0.95)
    mu, sigma = math.log(median), math.log(p95 / median) / z95
    for _ in range(100):
        p_cap = _STD.cdf((math.log(cap) - mu) / sigma)
        z50, z95t = _STD.inv_cdf(0.5 * p_cap), _STD.inv_cdf(0.95 * p_cap)
        new_sigma = (math.log(p95) - math.log(median)) / (z95t - z50)
        new_mu = math.log(median) - new_sigma * z50
        if abs(new_mu - mu) < 1e-12 and abs(new_sigma - sigma) < 1e-12:
            break
        mu, sigma = new_mu, new_sigma
    return TruncatedLognormal(mu=mu, sigma=sigma, cap=cap)
