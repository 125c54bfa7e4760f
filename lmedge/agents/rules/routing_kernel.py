"""The rule router's greedy over one LM's pairs, compiled.

At 10,000 workers a slot has ~100,000 (origin, LM) pairs and an LM up to
~5,000 priced candidates. Each pair's choice moves the queue the next one
sees, so the pairs go one after another; as numpy calls (`slot_table.py`
before this module) a pair cost a few array passes and their call overhead,
most of two seconds a slot. Compiled, a pair is one loop over the candidates.

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
    admit: bool,
    horizon: float,
    idle: int,  # candidates with no backlog
    out: Array,  # int64 per pair: the chosen column, -1 refused
) -> int:
    n = base.shape[0]
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
            tr = transfers[t]
            for c in range(n):
                v = (base[c] + tr[site[c]]) + per[c]
                if v < best or j < 0:
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
        out[k] = j
    return idle
