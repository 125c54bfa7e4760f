"""LYREO's Lyapunov scheduler per request, on token-level KV memory-time (`lyreo-ly`).

The seed's setting assigns each request a server (§III-E). Each slot, with
W_s the servers' workload read from their engines at the slot start
(`lmedge.policies.kit.requests`: KV-pool usage x pool bytes / (M_s x slot),
M_s the server's GPU memory), the virtual queues are updated,
Z_s <- max(Z_s + |W_s - mean W| - eps, 0) (`lmedge.metrics`), and the
slot's requests are taken in arrival order, each to the server minimizing

    nu * latency_s(r) / tau  +  sum_j Z_j * |W_j' - mean W'|

where W' is the workload after adding the request's KV memory-time
(kv bytes x (input + 215/2) tokens x latency_s / (M_s x slot)) at s, and
latency_s the continuous-batching estimate of the kit. The sum is computed
exactly over the servers (O(S^2) a request: 8 servers, ~100 requests a slot
is ~6,000 terms). Ties go to the earlier server in manifest order.

Ablations (seed §V-D), each a router of its own so that a profile names it:
`lyreo-nolb` drops the balance term (latency only), `lyreo-count` measures
workload as active requests over batch slots instead of KV memory-time.

Not here: the per-(origin, LM) batch scheduler `lyreo` (router.py) and the
PPO learner.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field

from lmedge.api import Arrival, Decision, RoutingMap, SlotObservation
from lmedge.errors import ConfigError
from lmedge.metrics import BALANCE_EPSILON, load_deviations, next_virtual_queues
from lmedge.policies.kit.params import PluginParams, parse_params
from lmedge.policies.kit.requests import RequestSlot, route_requests

NAME = "lyreo-ly"
#: Router name -> its fixed ablation parameters (seed §V-D).
VARIANTS: dict[str, dict[str, Any]] = {
    "lyreo-ly": {},
    "lyreo-nolb": {"balance": False},
    "lyreo-count": {"workload": "count"},
}


class LyreoRequestParams(PluginParams):
    nu: float = Field(default=0.5, ge=0, description="Weight of latency against load balance.")
    epsilon: float = Field(
        default=BALANCE_EPSILON, ge=0, description="Tolerated workload deviation (seed: 0.01)."
    )
    balance: bool = Field(default=True, description="False: no balance term (LYREO-NoLB).")
    workload: Literal["kv", "count"] = Field(
        default="kv", description="kv: KV memory-time; count: active requests (LYREO-Count)."
    )


class LyreoRequestRouter:
    """Per-request drift-plus-penalty routing; stateful through the virtual queues Z."""

    def __init__(self, name: str, params: LyreoRequestParams) -> None:
        self.name = name
        self.p = params
        self.z: dict[str, float] = {}

    def route(self, obs: SlotObservation) -> Decision[RoutingMap]:
        tau = obs.context.loop.tau_s
        by_count = self.p.workload == "count"

        def begin(slots: Mapping[str, RequestSlot]) -> None:
            loads: dict[str, float] = {}
            for slot in slots.values():
                for s in slot.servers:
                    w = s.count_load if by_count else s.kv_load
                    loads[s.name] = loads.get(s.name, 0.0) + w
            self.z.update(next_virtual_queues(self.z, load_deviations(loads), self.p.epsilon))

        def choose(slot: RequestSlot, a: Arrival, tokens: int) -> int:
            del a
            servers = slot.servers
            loads = [s.count_load if by_count else s.kv_load for s in servers]
            z = [self.z.get(s.name, 0.0) for s in servers]
            best, best_k = math.inf, 0
            for k in range(len(servers)):
                score = self.p.nu * slot.latency_s(k, tokens) / tau
                if self.p.balance:
                    add = slot.count_work(k) if by_count else slot.kv_work(k, tokens)
                    after = list(loads)
                    after[k] += add
                    mean = math.fsum(after) / len(after)
                    score += math.fsum(zj * abs(w - mean) for zj, w in zip(z, after, strict=True))
                if score < best:
                    best, best_k = score, k
            return best_k

        return route_requests(obs, self.name, choose, begin)


def build_request_router(name: str, params: Mapping[str, Any]) -> LyreoRequestRouter:
    """Factory of `lyreo-ly` and its ablations (`VARIANTS`): their fixed parameters win."""
    fixed = VARIANTS[name]
    clash = sorted(k for k in fixed if k in params and params[k] != fixed[k])
    if clash:
        raise ConfigError(f"router {name}: {', '.join(clash)} is fixed by the ablation")
    return LyreoRequestRouter(name, parse_params(LyreoRequestParams, {**params, **fixed}, name))
