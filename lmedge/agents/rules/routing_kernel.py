"""The rule router's greedy over one LM's pairs, compiled.

At 10,000 workers a slot has ~100,000 (origin, LM) pairs and an LM up to
~5,000 priced candidates. Each pair's choice moves the queue the next one
sees, so the pairs go one after another; as numpy calls (`slot_table.py`
before this module) a pair cost a few array passes and their call overhead,
most of two seconds a slot. Compiled, a pair is a pass over the LM's site
groups (uplink seconds depend on the site alone) and over the candidates of
the few groups whose lower bound reaches the cheapest actual cost.

The arithmetic is `slot_table.py`'s, term for term and in its order
(IEEE float64 both ways, no fast-math), so every choice is the same:

- cost of candidate c for p prompts (`per = p / rate`, as numpy divides it)
  from an origin that is a node:
  `(base[c] + transfer[site[c]]) + per[c]`; at the origin's own node
  `(base[c] + 0.0) + per[c]`; from an origin that is no node
  `base[c] + per[c]`;
- the first of the cheapest in column order, then the origin's own node on
  a tie in cost and weight;
- refused (-1) when every candidate has a queue and the cheapest queue-plus-
  service bound (cached per prompt count at its first use) is past the
  horizon, or when the choice has a queue and its cost is past the horizon;
- otherwise `backlog[c] += added` and `base[c] = backlog[c] / rate[c] + wait[c]`.
"""

from __future__ import annotations

import numpy as np

from lmedge.policies.compiled import Array, compiled


@compiled
def assign_pairs(
    base: Array,  # float64 per candidate: backlog / rate + wait (updated)
    backlog: Array,  # int64 per candidate (updated)
    rate: Array,
    wait: Array,
    weight: Array,
    site: Array,  # intp per candidate: the column of `transfers`
    transfers: Array,  # float64 [rows, sites]: uplink seconds per (link table, prompts)
    row: Array,  # int64 per pair: its row of `transfers`, -1 for an origin that is no node
    own: Array,  # int64 per pair: the origin's own column, -1 when it is none
    added: Array,  # int64 per pair: prompts added to the chosen queue
    floor_of: Array,  # int64 per pair: its row of `pers` and slot in `floors`
    pers: Array,  # float64 [prompt counts, candidates]: prompts priced / rate
    floors: Array,  # float64 per prompt count: the rejection bound, NaN until first used
    group_of: Array,  # int64 per candidate: its site group
    members: Array,  # int64: the candidates, group by group
    group_off: Array,  # int64 [groups + 1]: group g is members[group_off[g]:group_off[g + 1]]
    group_site: Array,  # int64 per group: its column of `transfers`
    admit: bool,
    horizon: float,
    idle: int,  # candidates with no backlog
    out: Array,  # int64 per pair: the chosen column, -1 refused
) -> int:
    n = base.shape[0]
    groups = group_site.shape[0]
    # per prompt count and site group: the least `base + per` of its candidates
    low_of = np.empty((pers.shape[0], groups))
    for f in range(pers.shape[0]):
        for g in range(groups):
            low_of[f, g] = _group_low(base, pers[f], members, group_off[g], group_off[g + 1])
    for k in range(added.shape[0]):
        f = floor_of[k]
        per = pers[f]
        if admit and idle == 0:
            if np.isnan(floors[f]):
                low = base[0] + per[0]
                for c in range(1, n):
                    v = base[c] + per[c]
                    if v < low:
                        low = v
                floors[f] = low
            if floors[f] > horizon:
                out[k] = -1
                continue
        t = row[k]
        best = np.inf
        j = -1
        if t >= 0:
            # By site group: `low + transfer` bounds each group's costs from below (both
            # sums are within a few ulps of the exact one, all terms are not negative),
            # so the cheapest candidates, ties included, lie in the groups whose bound
            # is within a relative 1e-12 of an actual cost; only those are priced.
            tr = transfers[t]
            lows = low_of[f]
            g_best = 0
            bound = lows[0] + tr[group_site[0]]
            for g in range(1, groups):
                v = lows[g] + tr[group_site[g]]
                if v < bound:
                    bound = v
                    g_best = g
            upper = np.inf
            for i in range(group_off[g_best], group_off[g_best + 1]):
                c = members[i]
                v = (base[c] + tr[site[c]]) + per[c]
                if v < upper:
                    upper = v
            cut = upper * (1.0 + 1e-12)
            for g in range(groups):
                if lows[g] + tr[group_site[g]] > cut:
                    continue
                for i in range(group_off[g], group_off[g + 1]):
                    c = members[i]
                    v = (base[c] + tr[site[c]]) + per[c]
                    if j < 0 or v < best or (v == best and c < j):
                        best = v
                        j = c
        else:
            for c in range(n):
                v = base[c] + per[c]
                if v < best or j < 0:
                    best = v
                    j = c
        o = own[k]
        if o >= 0:
            # No transfer to itself: the loop priced it higher, never lower (transfers
            # are not negative), so it wins where its own cost is the lowest, and
            # on a tie where it comes first or weighs the same (as `candidates()`).
            own_cost = (base[o] + 0.0) + per[o]
            if o == j or own_cost < best:
                best = own_cost
                j = o
            elif own_cost == best and (o < j or weight[o] == weight[j]):
                j = o
        if admit and backlog[j] > 0 and best > horizon:
            out[k] = -1
            continue
        a = added[k]
        if backlog[j] == 0 and a > 0:
            idle -= 1
        backlog[j] += a
        base[j] = backlog[j] / rate[j] + wait[j]
        g = group_of[j]
        for f2 in range(pers.shape[0]):
            low_of[f2, g] = _group_low(base, pers[f2], members, group_off[g], group_off[g + 1])
        out[k] = j
    return idle


@compiled
def _group_low(base: Array, per: Array, members: Array, start: int, end: int) -> float:
    low = np.inf
    for i in range(start, end):
        c = members[i]
        v = base[c] + per[c]
        if v < low:
            low = v
    return low
