"""Per-candidate features of one request's routing decision: the actor's input, any cluster.

The actor scores each candidate server of a request from that candidate's
row alone (shared weights), so a policy trained on 8 servers decides on 3 or
30. A row is the sequence-MDP state seen from one candidate (seed §IV-B1):
the server's capabilities (prefill and decode rates, memory) and dynamic
status as the per-request slot holds it (`lmedge.policies.kit.requests`:
active requests including those committed earlier in the slot, KV-pool
usage, workload W_s and its deviation from the mean, virtual queue Z_s), the
router's estimate of the request's latency there and its Lyapunov balance
term (`lyreo-ly`'s), and the request's size. Scales are fixed (log1p of
counts, shares, rates over the fastest GPU's (decode: at a full batch), W, Z
and the balance term over epsilon), so the policy file needs no normalizer. `ppo-fixed` sees no
virtual queue: its Z and balance columns are zero.

`greedy_scores` is the other input of a residual actor: the variant's
one-step greedy score per candidate (`lyreo-ly`'s drift-plus-penalty), which
the actor's MLP corrects.

Not here: the scores (`actor`), the Lyapunov terms (`lmedge.policies.lyreo.perrequest`).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from lmedge.api.engines import GIB
from lmedge.policies.kit.requests import RequestSlot
from lmedge.policies.lyreo.learning.params import LearnerParams

if TYPE_CHECKING:
    from lmedge.policies.lyreo.perrequest import Terms

#: Column names, in order (the policy file records them; a file whose names differ is refused).
FEATURES: tuple[str, ...] = (
    "latency_over_deadline",
    "balance",
    "z",
    "mean_z",
    "deviation",
    "workload",
    "kv_usage",
    "active",
    "batch_fill",
    "slot_requests",
    "prefill_rate",
    "peak_decode_rate",
    "memory",
    "ready",
    "input_tokens",
)
WIDTH = len(FEATURES)
Array = np.ndarray[Any, Any]
#: Latency estimates past this many deadlines all read the same (a hopeless candidate).
LATENCY_CAP = 10.0
#: Rates are read over the fastest GPU of the seed's setting (RTX 4090: prefill
#: 8,000 tokens/s, decode ~5,000 tokens/s at a full batch) and memory over its 24 GB.
PREFILL_SCALE, DECODE_SCALE, MEMORY_SCALE_GIB = 8000.0, 5000.0, 24.0


def static_columns(slot: RequestSlot) -> Array:
    """The columns that do not move within a slot (rates, memory, ready), per server."""
    return np.array(
        [
            [
                s.profile.prefill_tokens_per_s / PREFILL_SCALE,
                s.peak_decode_tokens_per_s / DECODE_SCALE,
                s.capacity_bytes / (MEMORY_SCALE_GIB * GIB),
                1.0 if s.ready else 0.0,
            ]
            for s in slot.servers
        ],
        dtype=float,
    ).reshape(-1, 4)


def request_rows(
    slot: RequestSlot,
    input_tokens: int,
    terms: Terms,
    deadline_s: float,
    use_z: bool,
    static: Array | None = None,
) -> Array:
    """The (servers, WIDTH) rows of one request of `slot` (module docstring).

    `terms` are the router's per-candidate latency and balance change, and the
    slot's workloads and virtual queues, all in `slot.servers` order; `static`
    is `static_columns(slot)` when the caller keeps it for the slot.
    """
    # Plain Python over the few servers, one array at the end: numpy's per-call
    # overhead on 8-element vectors cost twice as much (the decision budget is per request).
    eps = max(terms.epsilon, 1e-12)
    servers = slot.servers
    n = len(servers)
    w, z = terms.loads, terms.z
    mean_w = math.fsum(w) / max(n, 1)
    mean_z = math.log1p(math.fsum(z) / max(n, 1) / eps) if use_z else 0.0
    log1p, copysign = math.log1p, math.copysign
    tokens = log1p(input_tokens)
    flat: list[float] = []
    for k, s in enumerate(servers):
        if use_z:
            bal = terms.balance[k] / eps
            zs = (copysign(log1p(abs(bal)), bal), log1p(z[k] / eps), mean_z)
        else:
            zs = (0.0, 0.0, 0.0)
        dev = (w[k] - mean_w) / eps
        flat += (
            min(terms.latency[k] / deadline_s, LATENCY_CAP),
            *zs,
            copysign(log1p(abs(dev)), dev) if dev else 0.0,
            log1p(w[k] / eps),
            s.kv_usage(),
            log1p(s.active),
            min(s.active / s.slots, 2.0),
            log1p(s.batch_requests),
            0.0, 0.0, 0.0, 0.0,  # the static columns, below
            tokens,
        )  # fmt: skip
    rows = np.array(flat, dtype=float).reshape(n, WIDTH)
    rows[:, 10:14] = static_columns(slot) if static is None else static
    return rows


def greedy_scores(terms: Terms, deadline_s: float, params: LearnerParams) -> Array:
    """The variant's one-step greedy score per candidate, lower is better (the residual prior).

    lyreo, ly-ppo: `lyreo-ly`'s drift-plus-penalty, nu latency_s / deadline + balance_s
    (the router divides by tau, which is the LM's deadline unless the LM sets
    its own); ppo-fixed, which has no virtual queue: nu latency_s / deadline +
    fixed_penalty (W_s - mean W), its cost's fixed balancing penalty at the
    router's scale. The argmin is the greedy's choice, ties to the first.
    """
    nu = params.nu
    if params.variant == "ppo-fixed":
        w, c = terms.loads, params.fixed_penalty
        mean = math.fsum(w) / max(len(w), 1)
        return np.array(
            [nu * x / deadline_s + c * (y - mean) for x, y in zip(terms.latency, w, strict=True)]
        )
    return np.array(
        [nu * x / deadline_s + b for x, b in zip(terms.latency, terms.balance, strict=True)]
    )
