"""LYREO's per-batch greedy, compiled: the scores of one batch and its commit.

At 1,000 workers x 10,000 requests a slot the greedy scores ~10^7
(batch, candidate) pairs, one batch after another (each choice moves the
workloads the next one sees). As numpy calls that was ~25 array passes a batch
and most of a second a slot; compiled, it is a few microseconds a batch.

The slot's state is flat arrays (`SlotArrays`); the candidates of LM `l` are
`cand[lm_off[l]:lm_off[l + 1]]`, and a batch's transfer row is
`row_lat2/row_bw[row_off[r]:...]`, aligned with its LM's candidates. The
formulas are the router module's docstring, term for term.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from lmedge.policies.compiled import Array, compiled


class SlotArrays(NamedTuple):
    """One slot's state; `loads`, `total` and `cand_wait` change as batches commit."""

    loads: Array  # W per worker
    z: Array  # virtual queue per worker
    total: Array  # [sum of W], kept as the batches commit
    cand: Array  # worker index of each candidate, LM by LM
    cand_per: Array  # seconds a prompt takes there
    cand_wait: Array  # wait before a new prompt there (queue + cold start)
    cand_work: Array  # workload one prompt adds there
    cand_z: Array  # z at the candidate
    lm_off: Array
    lm_deadline: Array
    row_lat2: Array  # twice the one-way latency to each candidate
    row_bw: Array  # bandwidth to each candidate, bits/s
    row_off: Array


class Batches(NamedTuple):
    """The slot's batches, in routing order."""

    lm: Array
    row: Array
    own: Array  # the origin's position among the candidates, -1 if it is not one
    prompts: Array
    bits: Array  # request + response bits of the whole batch


@compiled
def _terms(
    lat2: float,
    bw: float,
    wait: float,
    per: float,
    w: float,
    work: float,
    zi: float,
    p: int,
    bits: float,
    mean: float,
    pull: float,
    n: int,
) -> tuple[float, float]:
    """(latency, balance) of one candidate: the module docstring's terms."""
    lat = lat2 + bits / bw + wait + per * (p + 1) / 2
    delta = p * work
    shift = delta / n
    dev = w - mean
    sign = 1.0 if dev > 0 else (-1.0 if dev < 0 else 0.0)
    bal = zi * (abs(w + delta - mean - shift) - abs(dev)) - shift * (pull - zi * sign)
    return lat, bal


@compiled
def _mean_and_pull(s: SlotArrays) -> tuple[float, float]:
    """(mean W, sum_s Z_s sign(W_s - mean): how the mean's shift moves every deviation)."""
    loads, n = s.loads, s.loads.size
    mean = s.total[0] / n
    pull = 0.0
    for k in range(n):
        if loads[k] > mean:
            pull += s.z[k]
        elif loads[k] < mean:
            pull -= s.z[k]
    return mean, pull


@compiled
def scores(b: int, s: SlotArrays, q: Batches, nu: float, w: Array, score: Array) -> int:
    """Fill the first m entries of `score` for batch `b` (`w` is scratch); return m.

    One output array and the loads gathered first, so that the loop vectorizes.
    """
    mean, pull = _mean_and_pull(s)
    n, lm = s.loads.size, q.lm[b]
    lo, m = s.lm_off[lm], s.lm_off[lm + 1] - s.lm_off[lm]
    r0 = s.row_off[q.row[b]]
    p, bits, own = q.prompts[b], q.bits[b], q.own[b]
    weight, deadline = nu * p, s.lm_deadline[lm]
    # local views: a third faster than reaching through the tuple in the loop
    lat2, bw = s.row_lat2[r0 : r0 + m], s.row_bw[r0 : r0 + m]
    cand, per, wait = s.cand[lo : lo + m], s.cand_per[lo : lo + m], s.cand_wait[lo : lo + m]
    work, cz = s.cand_work[lo : lo + m], s.cand_z[lo : lo + m]
    for j in range(m):
        w[j] = s.loads[cand[j]]
    for j in range(m):
        lat, bal = _terms(
            lat2[j], bw[j], wait[j], per[j], w[j], work[j], cz[j], p, bits, mean, pull, n
        )
        score[j] = weight * lat / deadline + bal
    if own >= 0:  # the origin itself: no transfer
        lat, bal = _terms(
            0.0, np.inf, wait[own], per[own], w[own], work[own], cz[own], p, 0.0, mean, pull, n
        )
        score[own] = weight * lat / deadline + bal
    return int(m)


@compiled
def batch_scores(
    b: int, s: SlotArrays, q: Batches, nu: float, latency: Array, balance: Array, score: Array
) -> int:
    """`scores`, with each candidate's latency and balance too (for a learner); return m.

    The same terms and the same score formula as `scores`, computed once.
    """
    mean, pull = _mean_and_pull(s)
    lm, p, own = q.lm[b], q.prompts[b], q.own[b]
    lo, m, r0 = s.lm_off[lm], s.lm_off[lm + 1] - s.lm_off[lm], s.row_off[q.row[b]]
    weight, deadline = nu * p, s.lm_deadline[lm]
    for j in range(m):
        c = lo + j
        local = j == own
        latency[j], balance[j] = _terms(
            0.0 if local else s.row_lat2[r0 + j],
            np.inf if local else s.row_bw[r0 + j],
            s.cand_wait[c],
            s.cand_per[c],
            s.loads[s.cand[c]],
            s.cand_work[c],
            s.cand_z[c],
            p,
            0.0 if local else q.bits[b],
            mean,
            pull,
            s.loads.size,
        )
        score[j] = weight * latency[j] / deadline + balance[j]
    return int(m)


@compiled
def commit(b: int, j: int, s: SlotArrays, q: Batches) -> int:
    """Send batch `b` to its LM's candidate `j`; return that worker's index."""
    c = s.lm_off[q.lm[b]] + j
    p = q.prompts[b]
    delta = p * s.cand_work[c]
    s.loads[s.cand[c]] += delta
    s.total[0] += delta
    s.cand_wait[c] += p * s.cand_per[c]
    return int(s.cand[c])


@compiled
def first_min(score: Array, m: int) -> int:
    """Index of the lowest finite score among the first m (the first on ties); 0 if none."""
    best, at = np.inf, 0
    for j in range(m):
        if score[j] < best:
            best, at = score[j], j
    return at


@compiled
def route_all(s: SlotArrays, q: Batches, nu: float, width: int, out: Array) -> None:
    """Route every batch in order, each to its lowest-scoring candidate."""
    w, score = np.empty(width), np.empty(width)
    for b in range(q.lm.size):
        out[b] = commit(b, first_min(score, scores(b, s, q, nu, w, score)), s, q)
