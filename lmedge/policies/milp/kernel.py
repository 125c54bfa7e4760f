"""The greedy plan's batch loop (greedy.py), compiled: one pass over the batches.

At 1,000 workers the greedy plan prices ~14,000 batches against the ~25
workers of their site every slot (~350,000 (batch, node) pairs), which is
~0.3 s in Python and a millisecond here. The arithmetic is the Python
greedy's, operation for operation (`transfer_s`'s `2 * latency + bits / bw`,
then `+ cold + per * (queued + k)`), and ties break on the same key
(delay, inactive, worker order), so the plan is the same to the bit;
`tests/unit/policies/milp/test_greedy_kernel.py` holds it equal to the
Python reference.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lmedge.policies.compiled import compiled, inlined
from lmedge.policies.kit.estimates import DEFAULT_LINK

Array = np.ndarray[Any, Any]

GPU, CPU = 1, 2  # mode codes; `allowed` holds a bit per mode, GPU first (fastest)


@inlined
def _link(o: int, d: int, links: tuple[Any, ...]) -> tuple[float, float]:
    """`estimates._link` on `NodeLinks.arrays` (node positions o, d)."""
    site, intra_lat, intra_bw, declared, out_lat, out_bw = links
    if o == d:
        return 0.0, np.inf
    if site[o] == site[d]:
        return intra_lat[o], intra_bw[o]
    if declared[o, site[d]]:
        return out_lat[o, site[d]], out_bw[o, site[d]]
    if declared[d, site[o]]:
        return out_lat[d, site[o]], out_bw[d, site[o]]
    return DEFAULT_LINK[0], DEFAULT_LINK[1]


@compiled
def greedy(
    origin: Array,  # per batch: the origin's NodeLinks position, -1 outside the context
    lm: Array,  # per batch: LM position
    k: Array,  # per batch: prompts
    bits: Array,  # per batch: request + response bits of its prompts
    feasible_ptr: Array,  # per LM: its feasible workers feasible_idx[ptr[i]:ptr[i + 1]]
    feasible_idx: Array,  # worker positions
    node_of: Array,  # per worker: its NodeLinks position
    allowed: Array,  # [worker, LM]: GPU | CPU bits of the modes the MILP may use
    active: Array,  # [worker, LM]: the mode code chosen so far, 0 none (updated)
    queued: Array,  # [worker, LM]: prompts queued or sent this slot (updated)
    budget: Array,  # [worker, 4]: cores, memory, vGPUs, vRAM left (updated)
    need: Array,  # [LM, 3]: default cores, deployment memory, min vRAM
    per_prompt: Array,  # [LM, 2]: seconds per prompt on GPU, on CPU
    cold_s: float,
    links: tuple[Any, ...],  # NodeLinks.arrays
) -> Array:
    """Each batch's worker position (-1: fits nowhere); `active`, `queued` and `budget`
    end as the plan leaves them. Batches come largest first, as greedy.py sorts them."""
    out = np.full(len(lm), -1, dtype=np.int64)
    for b in range(len(lm)):
        i = lm[b]
        best_d, best_inactive, best_n, best_m = np.inf, 2, -1, 0
        for p in range(feasible_ptr[i], feasible_ptr[i + 1]):
            n = feasible_idx[p]
            if origin[b] < 0 or origin[b] == node_of[n]:
                transfer = 0.0
            else:
                lat, bw = _link(origin[b], node_of[n], links)
                transfer = 2 * lat + bits[b] / bw
            on = active[n, i]
            for m in (GPU, CPU):
                if not allowed[n, i] & m:
                    continue
                if on != 0 and on != m:
                    continue
                if on == 0:
                    fits = (
                        need[i, 0] <= budget[n, 0] + 1e-9
                        and need[i, 1] <= budget[n, 1] + 1e-9
                        and (m != GPU or (budget[n, 2] >= 1 and need[i, 2] <= budget[n, 3] + 1e-9))
                    )
                    if not fits:
                        continue
                cold = 0.0 if on != 0 else cold_s
                d = transfer + cold + per_prompt[i, m - 1] * (queued[n, i] + k[b])
                inactive = 1 if on == 0 else 0
                if d < best_d or (
                    d == best_d
                    and (inactive < best_inactive or (inactive == best_inactive and n < best_n))
                ):
                    best_d, best_inactive, best_n, best_m = d, inactive, n, m
        if best_n < 0:
            continue
        if active[best_n, i] == 0:
            active[best_n, i] = best_m
            budget[best_n, 0] -= need[i, 0]
            budget[best_n, 1] -= need[i, 1]
            if best_m == GPU:
                budget[best_n, 2] -= 1
                budget[best_n, 3] -= need[i, 2]
        queued[best_n, i] += k[b]
        out[b] = best_n
    return out
