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
counts, shares, rates over the fastest GPU's, W, Z and the balance term over
epsilon), so the policy file needs no normalizer. `ppo-fixed` sees no
virtual queue: its Z and balance columns are zero.

Not here: the scores (`actor`), the Lyapunov terms (`lmedge.policies.lyreo.perrequest`).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from lmedge.api.engines import GIB
from lmedge.policies.kit.requests import RequestSlot

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
    "decode_rate",
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


def _signed_log(x: float) -> float:
    return math.copysign(math.log1p(abs(x)), x)


def request_rows(
    slot: RequestSlot, input_tokens: int, terms: Terms, deadline_s: float, use_z: bool
) -> Array:
    """The (servers, WIDTH) rows of one request of `slot` (module docstring).

    `terms` are the router's per-candidate latency and balance change, and the
    slot's workloads and virtual queues, all in `slot.servers` order.
    """
    eps = max(terms.epsilon, 1e-12)
    mean_w = math.fsum(terms.loads) / max(len(terms.loads), 1)
    mean_z = math.fsum(terms.z) / max(len(terms.z), 1)
    tokens = math.log1p(input_tokens)
    rows = []
    for k, s in enumerate(slot.servers):
        b = min(s.active + 1, s.slots)
        rows.append(
            [
                min(terms.latency[k] / deadline_s, LATENCY_CAP),
                _signed_log(terms.balance[k] / eps) if use_z else 0.0,
                math.log1p(terms.z[k] / eps) if use_z else 0.0,
                math.log1p(mean_z / eps) if use_z else 0.0,
                _signed_log((terms.loads[k] - mean_w) / eps),
                math.log1p(terms.loads[k] / eps),
                s.kv_usage(),
                math.log1p(s.active),
                min(s.active / s.slots, 2.0),
                math.log1p(s.batch_requests),
                s.profile.prefill_tokens_per_s / PREFILL_SCALE,
                s.profile.decode_tokens_per_s(b) / DECODE_SCALE,
                s.capacity_bytes / (MEMORY_SCALE_GIB * GIB),
                1.0 if s.ready else 0.0,
                tokens,
            ]
        )
    return np.array(rows, dtype=float).reshape(-1, WIDTH)
