"""CEMA's evaluator and memetic search, compiled, drawing from Python's own random stream.

At 1,000 workers a slot has ~10,000 genes of ~900 alleles each; written as
Python over dictionaries the search took minutes a slot. Here the slot is
flat arrays (`Slot`): a gene's terms at an allele are computed from its
destination's row and its origin's links (`_at`), never stored for every allele,
and each chromosome of the population carries its genes' terms, so a child
made by crossover copies them and mutation recomputes only the genes it moves.

The search is the router module's docstring step by step, and it draws from
the router's `random.Random`: `mt` and `pos` are that generator's MT19937
state (`getstate()`), and `_random`, `_randbelow`, `_shuffle` and `_sample2`
are CPython 3.11's `random()`, `_randbelow`, `shuffle` and
`sample(range(n), 2)`. Every sum runs in gene order, as `sum()` does, so a
seed gives the routes of the plain-Python search
(`tests/unit/policies/cema/test_reference.py` holds them equal).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from lmedge.policies.compiled import Array, compiled, inlined

KIB_BITS = 1024 * 8
#: `Slot.direct` of a batch slot: terms computed from the rows, not given per gene.
NO_DIRECT = np.zeros((0, 0, 6))
_N, _M = 624, 397


class Slot(NamedTuple):
    """One slot's genes, the destinations (model, node) and the links between nodes."""

    cls: Array  # gene -> request class
    prompts: Array  # float: `prompts * x` is Python's int times float
    weight: Array  # prompts / the slot's prompts
    row: Array  # gene -> its origin's row of `lat2` and `bw`
    node: Array  # destination -> position of its node
    dest_site: Array  # destination -> its node's site
    # destination -> (seconds a prompt takes in the mode it would serve in, the
    # node's cost per hour, busy power of that mode, request + response KiB of
    # the model): one row, so a gene moved there reads one cache line
    dest: Array
    backlog: Array  # seconds before a new prompt would start (queue + cold start)
    off: Array  # alleles of class c: alleles[off[c]:off[c + 1]], in allele order
    alleles: Array
    legal: Array  # [class, destination] -> whether it is an allele of the class
    loss: Array  # [class, destination] -> 1 - predicted quality
    row_node: Array  # origin row -> the origin's node position, -1 if unknown
    row_site: Array  # origin row -> the origin's site
    lat2: Array  # [origin row, site] -> twice the one-way latency s, NaN: the receiver's
    bw: Array  # [origin row, site] -> bandwidth bit/s
    recv_lat2: Array  # [node, site] -> twice the latency the node declares to that site
    recv_bw: Array  # (or `DEFAULT_LINK`'s when it declares none)
    # request-level routing (`requests.py`): [gene, destination] -> (weighted loss,
    # cost, energy, busy seconds at the saturated batch rate, transfer seconds, the
    # request's seconds alone at the single-request rate); shape (0, 0, 6) for batches
    direct: Array


# -- CPython's random.Random (Modules/_randommodule.c, Lib/random.py) ----------


@compiled
def _twist(mt: Array) -> None:
    for kk in range(_N):
        y = (np.int64(mt[kk]) & 0x80000000) | (np.int64(mt[(kk + 1) % _N]) & 0x7FFFFFFF)
        v = np.int64(mt[(kk + _M) % _N]) ^ (y >> 1)
        if y & 1:
            v ^= 0x9908B0DF
        mt[kk] = np.uint32(v)


@inlined
def _genrand(mt: Array, pos: Array) -> int:
    i = pos[0]
    if i >= _N:
        _twist(mt)
        i = 0
    pos[0] = i + 1
    y = np.int64(mt[i])
    y ^= y >> 11
    y ^= (y << 7) & 0x9D2C5680
    y ^= (y << 15) & 0xEFC60000
    y ^= y >> 18
    return int(y)


@inlined
def _random(mt: Array, pos: Array) -> float:
    a = _genrand(mt, pos) >> 5
    b = _genrand(mt, pos) >> 6
    return (a * 67108864.0 + b) * (1.0 / 9007199254740992.0)


@inlined
def _bit_length(n: int) -> int:
    k = 0
    while (n >> k) > 0:
        k += 1
    return k


@inlined
def _randbelow(mt: Array, pos: Array, n: int) -> int:
    return _randbelow_k(mt, pos, n, _bit_length(n))


@inlined
def _randbelow_k(mt: Array, pos: Array, n: int, k: int) -> int:
    """`_randbelow(n)` with k = n's bit length given (the mutation knows it per class)."""
    r = _genrand(mt, pos) >> (32 - k)
    while r >= n:
        r = _genrand(mt, pos) >> (32 - k)
    return r


@compiled
def _sample2(mt: Array, pos: Array, n: int) -> tuple[int, int]:
    """`random.sample(range(n), 2)`: a small population by pool, a large one by rejection."""
    first = _randbelow(mt, pos, n)
    if n <= 21:
        second = _randbelow(mt, pos, n - 1)
        return first, (n - 1 if second == first else second)
    second = _randbelow(mt, pos, n)
    while second == first:
        second = _randbelow(mt, pos, n)
    return first, second


@compiled
def _shuffle(mt: Array, pos: Array, x: Array) -> None:
    for i in range(len(x) - 1, 0, -1):
        j = _randbelow(mt, pos, i + 1)
        x[i], x[j] = x[j], x[i]


# -- the evaluator ---------------------------------------------------------------


@compiled
def link_table(
    origins: Array,
    site: Array,
    intra_lat: Array,
    intra_bw: Array,
    declared: Array,
    out_lat: Array,
    out_bw: Array,
) -> tuple[Array, Array, Array]:
    """(2 x latency, bandwidth, origin's site) from each origin to each site.

    `origins` are node positions (-1: unknown, whose transfers are 0 s).
    `estimates.NodeLinks`'s rules: the origin's own site is its intra-site
    link, another site its first declared link there; where it declares none
    the latency is NaN, and the receiver's declared link (`recv_*`) applies.
    Small enough to stay in cache, unlike a row per (origin, node).
    """
    sites = declared.shape[1]
    lat2 = np.zeros((len(origins), sites))
    bw = np.full((len(origins), sites), np.inf)
    row_site = np.zeros(len(origins), dtype=np.int64)
    for r in range(len(origins)):
        o = origins[r]
        if o < 0:
            continue
        row_site[r] = site[o]
        for k in range(sites):
            if k == site[o]:
                lat2[r, k], bw[r, k] = 2 * intra_lat[o], intra_bw[o]
            elif declared[o, k]:
                lat2[r, k], bw[r, k] = 2 * out_lat[o, k], out_bw[o, k]
            else:
                lat2[r, k] = np.nan
    return lat2, bw, row_site


@inlined
def _terms(
    weight: float,
    loss: float,
    prompts: float,
    per: float,
    price: float,
    watts: float,
    kib: float,
    lat2: float,
    bw: float,
    radio: float,
) -> tuple[float, float, float, float, float]:
    """(weighted loss, cost, energy, busy seconds, transfer seconds) of a gene at an allele."""
    busy = prompts * per
    net = lat2 + prompts * kib * KIB_BITS / bw  # `transfer_s`: 2 x latency + bits / bandwidth
    return weight * loss, busy * price / 3600.0, busy * watts + net * radio, busy, net


@inlined
def _at(s: Slot, radio: float, g: int, d: int) -> tuple[float, float, float, float, float]:
    """`_terms` of gene g at destination d."""
    if s.direct.shape[0] > 0:
        t = s.direct[g, d]
        return t[0], t[1], t[2], t[3], t[4]
    r, n = s.row[g], s.node[d]
    if n == s.row_node[r]:  # the origin itself: `transfer_s` is 0
        lat2, bw = 0.0, np.inf
    else:
        lat2, bw = s.lat2[r, s.dest_site[d]], s.bw[r, s.dest_site[d]]
        if np.isnan(lat2):
            lat2, bw = s.recv_lat2[n, s.row_site[r]], s.recv_bw[n, s.row_site[r]]
    return _terms(
        s.weight[g],
        s.loss[s.cls[g], d],
        s.prompts[g],
        s.dest[d, 0],
        s.dest[d, 1],
        s.dest[d, 2],
        s.dest[d, 3],
        lat2,
        bw,
        radio,
    )


@compiled
def prepare(s: Slot, radio: float) -> tuple[Array, Array]:
    """The bounds [Q_ub, C_ub, E_ub, T_ub] and the load-aware seed, in one pass over the alleles.

    Bounds: each term's per-gene worst allele, summed in gene order (T_ub: the
    worst backlog + every gene's worst service + the worst transfer). Seed:
    largest batch first, each to the destination that would finish it
    earliest (backlog + service + transfer; for a request, the later of its
    destination's queue finishing and the request alone at the single-request
    rate, the continuous-batching model of `_raw`).
    """
    n = len(s.cls)
    worst = np.zeros((n, 5))  # per gene: loss, cost, energy, service, transfer
    finish = s.backlog.copy()
    seed = np.empty(n, dtype=np.int64)
    for g in np.argsort(-s.prompts, kind="mergesort"):
        c = s.cls[g]
        a0 = s.alleles[s.off[c]]
        _, mc, me, ms, mn = _at(s, radio, g, a0)
        best, best_v, mq = a0, _finish_at(s, finish, g, a0, ms) + mn, s.loss[c, a0]
        best_busy = ms
        for a in range(s.off[c] + 1, s.off[c + 1]):
            d = s.alleles[a]
            _, tc, te, busy, net = _at(s, radio, g, d)
            v = _finish_at(s, finish, g, d, busy) + net
            if v < best_v:  # the first of equals, as `min` keeps it
                best, best_v, best_busy = d, v, busy
            if s.loss[c, d] > mq:  # `max`'s order: only a greater value replaces
                mq = s.loss[c, d]
            if tc > mc:
                mc = tc
            if te > me:
                me = te
            if busy > ms:
                ms = busy
            if net > mn:
                mn = net
        worst[g, 0], worst[g, 1], worst[g, 2], worst[g, 3], worst[g, 4] = mq, mc, me, ms, mn
        seed[g] = best
        finish[best] += best_busy
    q_ub = c_ub = e_ub = svc = net_ub = 0.0
    for g in range(n):
        q_ub += s.weight[g] * worst[g, 0]
        c_ub += worst[g, 1]
        e_ub += worst[g, 2]
        svc += worst[g, 3]
        if g == 0 or worst[g, 4] > net_ub:
            net_ub = worst[g, 4]
    worst_backlog = 0.0
    first = True
    for c in range(len(s.off) - 1):
        for a in range(s.off[c], s.off[c + 1]):
            b = s.backlog[s.alleles[a]]
            if first or b > worst_backlog:
                worst_backlog, first = b, False
    out = np.empty(4)
    out[0], out[1], out[2] = q_ub, c_ub, e_ub
    out[3] = worst_backlog + svc + net_ub
    return out, seed


@inlined
def _finish_at(s: Slot, finish: Array, g: int, d: int, busy: float) -> float:
    """When gene g would finish at d after the work `finish[d]` already holds.

    A batch: `finish[d] + busy`. A request (continuous batching): its
    destination's work at the saturated rate, but never before the request
    alone at the single-request rate after the backlog.
    """
    v = finish[d] + busy
    if s.direct.shape[0] > 0:
        alone = s.backlog[d] + s.direct[g, d, 5]
        if alone > v:
            return float(alone)
    return float(v)


@compiled
def transfer(s: Slot, g: int, d: int) -> float:
    """Gene g's transfer seconds to destination d (`estimates.transfer_s`)."""
    return _at(s, 0.0, g, d)[4]


@inlined
def _norm(value: float, bound: float) -> float:
    return value / bound if bound > 0 else 0.0


@inlined
def _fitness(q: float, c: float, e: float, t: float, ub: Array, w: Array) -> float:
    return float(
        w[0] * _norm(q, ub[0])
        + w[1] * _norm(c, ub[1])
        + w[2] * _norm(e, ub[2])
        + w[3] * _norm(t, ub[3])
    )


class Genes(NamedTuple):
    """Chromosomes (rows): each gene's destination, and its terms there (`_terms`'s order).

    A gene's five terms sit together (`terms[r, g]`), so moving a gene
    writes one cache line, and copying a stretch of genes is one copy.
    """

    dest: Array  # [row, gene]
    terms: Array  # [row, 5 x gene + (weighted loss, cost, energy, busy, transfer)]


@inlined
def _set(s: Slot, radio: float, p: Genes, r: int, g: int, d: int) -> None:
    p.dest[r, g] = d
    t, k = p.terms[r], 5 * g
    t[k], t[k + 1], t[k + 2], t[k + 3], t[k + 4] = _at(s, radio, g, d)


@compiled
def _copy(a: Genes, src: int, b: Genes, dst: int, lo: int, hi: int) -> None:
    b.dest[dst, lo:hi] = a.dest[src, lo:hi]
    b.terms[dst, 5 * lo : 5 * hi] = a.terms[src, 5 * lo : 5 * hi]


@compiled
def _raw(s: Slot, p: Genes, r: int, finish: Array) -> tuple[float, float, float, float]:
    """(Q, C, E, T) of row r; `finish` is left with each destination's finish time."""
    q = c = e = 0.0
    n = p.dest.shape[1]
    dest, t = p.dest[r], p.terms[r]
    finish[:] = s.backlog
    for g in range(n):
        q += t[5 * g]
        c += t[5 * g + 1]
        e += t[5 * g + 2]
        finish[dest[g]] += t[5 * g + 3]
    makespan = 0.0
    for g in range(n):
        v = _completion(s, finish, g, dest[g], t[5 * g + 4])
        if g == 0 or v > makespan:
            makespan = v
    return q, c, e, makespan


@inlined
def _completion(s: Slot, finish: Array, g: int, d: int, net: float) -> float:
    """Gene g's completion at d once every gene's work is in `finish` (`_raw`).

    A request is never done before it would be alone at the single-request
    rate after the backlog (continuous batching shares the rate, it does not
    speed one sequence up).
    """
    v = finish[d]
    if s.direct.shape[0] > 0 and s.backlog[d] + s.direct[g, d, 5] > v:
        v = s.backlog[d] + s.direct[g, d, 5]
    return float(net + v)


@compiled
def raw(s: Slot, radio: float, chromosome: Array) -> Array:
    """[Q, C, E, T] of one chromosome (destination per gene)."""
    p = _genes(1, len(chromosome))
    for g in range(len(chromosome)):
        _set(s, radio, p, 0, g, chromosome[g])
    out = np.empty(4)
    out[0], out[1], out[2], out[3] = _raw(s, p, 0, np.empty(len(s.backlog)))
    return out


@compiled
def fitness(values: Array, ub: Array, w: Array) -> float:
    """J from [Q, C, E, T] (`raw`), the bounds and the weights."""
    return _fitness(values[0], values[1], values[2], values[3], ub, w)


@compiled
def _genes(rows: int, n: int) -> Genes:
    return Genes(np.empty((rows, n), dtype=np.int64), np.empty((rows, 5 * n)))


@compiled
def _score(s: Slot, p: Genes, r: int, ub: Array, w: Array, finish: Array) -> float:
    q, c, e, t = _raw(s, p, r, finish)
    return _fitness(q, c, e, t, ub, w)


@compiled
def _repair(
    s: Slot,
    radio: float,
    p: Genes,
    r: int,
    fit: float,
    budget: int,
    ub: Array,
    w: Array,
    finish: Array,
    mt: Array,
    pos: Array,
) -> float:
    """Best improving worst-gene move or 2-opt swap of row r within the budget; row r gets it."""
    n = p.dest.shape[1]
    _raw(s, p, r, finish)
    worst, worst_v = 0, 0.0
    for g in range(n):
        v = _completion(s, finish, g, p.dest[r, g], p.terms[r, 5 * g + 4])
        if g == 0 or v > worst_v:
            worst, worst_v = g, v
    here = p.dest[r, worst]
    c = s.cls[worst]
    alternatives = np.empty(s.off[c + 1] - s.off[c], dtype=np.int64)
    k = 0
    for a in range(s.off[c], s.off[c + 1]):
        if s.alleles[a] != here:
            alternatives[k] = s.alleles[a]
            k += 1
    alternatives = alternatives[:k]
    _shuffle(mt, pos, alternatives)
    best_fit = fit
    # the best trial as (gene, destination) x 2; -1: the child itself
    b1, bd1, b2, bd2 = -1, 0, -1, 0
    saved = _genes(1, 2)
    _keep(p, r, saved, 0, worst)
    moves = budget // 2
    for d in alternatives[: moves if moves > 0 else 1]:
        _set(s, radio, p, r, worst, d)
        f = _score(s, p, r, ub, w, finish)
        budget -= 1
        if f < best_fit:
            best_fit, b1, bd1, b2 = f, worst, d, -1
    _restore(p, r, saved, 0, worst)
    while budget > 0 and n > 1:
        g1, g2 = _sample2(mt, pos, n)
        budget -= 1
        d1, d2 = p.dest[r, g1], p.dest[r, g2]
        if not s.legal[s.cls[g1], d2] or not s.legal[s.cls[g2], d1]:
            continue
        _keep(p, r, saved, 0, g1)
        _keep(p, r, saved, 1, g2)
        _set(s, radio, p, r, g1, d2)
        _set(s, radio, p, r, g2, d1)
        f = _score(s, p, r, ub, w, finish)
        _restore(p, r, saved, 0, g1)
        _restore(p, r, saved, 1, g2)
        if f < best_fit:
            best_fit, b1, bd1, b2, bd2 = f, g1, d2, g2, d1
    if b1 >= 0:
        _set(s, radio, p, r, b1, bd1)
    if b2 >= 0:
        _set(s, radio, p, r, b2, bd2)
    return best_fit


@compiled
def _keep(p: Genes, r: int, saved: Genes, k: int, g: int) -> None:
    saved.dest[0, k] = p.dest[r, g]
    saved.terms[0, 5 * k : 5 * k + 5] = p.terms[r, 5 * g : 5 * g + 5]


@compiled
def _restore(p: Genes, r: int, saved: Genes, k: int, g: int) -> None:
    p.dest[r, g] = saved.dest[0, k]
    p.terms[r, 5 * g : 5 * g + 5] = saved.terms[0, 5 * k : 5 * k + 5]


@compiled
def search(
    s: Slot,
    radio: float,
    seed: Array,
    ub: Array,
    w: Array,
    rates: Array,
    sizes: Array,
    mt: Array,
    pos: Array,
) -> Array:
    """The memetic search from `seed` (`prepare`); returns the best chromosome.

    `rates` = [p_crossover, p_mutation, p_repair]; `sizes` = [population,
    generations, tournament, elite, repair_budget]. `mt` and `pos` advance as
    the Python generator would.
    """
    n = len(s.cls)
    size, generations, tournament, elite, budget = sizes[0], sizes[1], sizes[2], sizes[3], sizes[4]
    p_cross, p_mut, p_repair = rates[0], rates[1], rates[2]
    pops = (_genes(size, n), _genes(size, n))
    fits = (np.empty(size), np.empty(size))
    finish = np.empty(len(s.backlog))
    bits = np.array([_bit_length(s.off[c + 1] - s.off[c]) for c in range(len(s.off) - 1)])
    cur = pops[0]
    for g in range(n):
        _set(s, radio, cur, 0, g, seed[g])
    for r in range(1, size):
        for g in range(n):
            c = s.cls[g]
            k = s.off[c + 1] - s.off[c]
            _set(s, radio, cur, r, g, s.alleles[s.off[c] + _randbelow_k(mt, pos, k, bits[c])])
    fit = fits[0]
    for r in range(size):
        fit[r] = _score(s, cur, r, ub, w, finish)
    order = np.argsort(fit, kind="mergesort")
    for gen in range(generations):
        nxt, nfit = pops[(gen + 1) % 2], fits[(gen + 1) % 2]
        kept = min(elite, size)
        for k in range(kept):
            _copy(cur, order[k], nxt, k, 0, n)
            nfit[k] = fit[order[k]]
        for r in range(kept, size):
            ra = _pick(mt, pos, size, tournament)
            rb = _pick(mt, pos, size, tournament)
            a, b = order[ra], order[rb]
            if _random(mt, pos) < p_cross and n >= 2:
                i, j = _sample2(mt, pos, n + 1)
                if i > j:
                    i, j = j, i
                _copy(cur, a, nxt, r, 0, i)
                _copy(cur, b, nxt, r, i, j)
                _copy(cur, a, nxt, r, j, n)
            else:
                _copy(cur, a, nxt, r, 0, n)
            for g in range(n):
                c = s.cls[g]
                k = s.off[c + 1] - s.off[c]
                if k > 1 and _random(mt, pos) < p_mut:
                    a = s.off[c] + _randbelow_k(mt, pos, k, bits[c])
                    _set(s, radio, nxt, r, g, s.alleles[a])
            f = _score(s, nxt, r, ub, w, finish)
            if _random(mt, pos) < p_repair:
                f = _repair(s, radio, nxt, r, f, budget, ub, w, finish, mt, pos)
            nfit[r] = f
        cur, fit = nxt, nfit
        order = np.argsort(fit, kind="mergesort")
    best: Array = cur.dest[order[0]].copy()
    return best


@compiled
def _pick(mt: Array, pos: Array, size: int, tournament: int) -> int:
    """Tournament: the best rank of `tournament` random ranks."""
    best = _randbelow(mt, pos, size)
    for _ in range(tournament - 1):
        best = min(best, _randbelow(mt, pos, size))
    return best
