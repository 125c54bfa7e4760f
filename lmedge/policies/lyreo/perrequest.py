"""LYREO's Lyapunov scheduler per request, on token-level KV memory-time (`lyreo-ly`).

The seed's setting assigns each request a server (§III-E). The router is a
request-level router (`Capabilities.routes_requests`): the backend hands it
the requests of each routing window (`RequestWindow`; by default a window is
the 1-s slot, `kit.requests.WindowParams`) at the window's end. At the first
window of each slot, with W_s the servers' workload read from their engines
in the window's snapshot (`lmedge.policies.kit.requests`: KV-pool usage x
pool bytes / (M_s x slot), M_s the server's GPU memory), the virtual queues
are updated, Z_s <- max(Z_s + |W_s - mean W| - eps, 0) (`lmedge.metrics`),
and kept across windows; the window's requests are taken in arrival order,
each to the server minimizing

    nu * latency_s(r) / tau  +  sum_j Z_j * |W_j' - mean W'|

where W' is the workload after adding the request's KV memory-time
(kv bytes x (input + 215/2) tokens x latency_s / (M_s x slot)) at s, and
latency_s the continuous-batching estimate of the kit. The sum is computed
exactly over the servers (O(S^2) a request: 8 servers, ~100 requests a slot
is ~6,000 terms). Ties go to the earlier server in manifest order. The
slot's `RoutingMap` (`route`, the fallback where windows are not routed) is
the same rule per (origin, LM) pair with the virtual queues as they stand:
it neither moves them nor asks the learner.

Ablations (seed §V-D), each a router of its own so that a profile names it:
`lyreo-nolb` drops the balance term (latency only), `lyreo-count` measures
workload as active requests over batch slots instead of KV memory-time.

The learned routers (`lyreo`, `ly-ppo`, `ppo-fixed`, seed §IV-B) are this
router with a `RequestLearner`: for each request it gets the same terms per
candidate (`Terms`) and returns the server, and it receives the finished
requests (`observe`), matched back to its decisions by request id.

Not here: the per-(origin, LM) batch greedy `lyreo-greedy` (router.py, for
per-prompt scenarios), the actor and the PPO learner (`learning`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import numpy as np
from pydantic import Field

from lmedge.api import (
    Arrival,
    Capabilities,
    Decision,
    RequestRecord,
    RequestWindow,
    Route,
    RoutingMap,
    SlotObservation,
)
from lmedge.errors import ConfigError
from lmedge.metrics import BALANCE_EPSILON, load_deviations, next_virtual_queues
from lmedge.policies.kit.params import parse_params
from lmedge.policies.kit.requests import RequestSlot, WindowParams, route_window, slot_map

NAME = "lyreo-ly"
#: Router name -> its fixed ablation parameters (seed §V-D).
VARIANTS: dict[str, dict[str, Any]] = {
    "lyreo-ly": {},
    "lyreo-nolb": {"balance": False},
    "lyreo-count": {"workload": "count"},
}


class LyreoRequestParams(WindowParams):
    nu: float = Field(default=0.5, ge=0, description="Weight of latency against load balance.")
    epsilon: float = Field(
        default=BALANCE_EPSILON, ge=0, description="Tolerated workload deviation (seed: 0.01)."
    )
    balance: bool = Field(default=True, description="False: no balance term (LYREO-NoLB).")
    workload: Literal["kv", "count"] = Field(
        default="kv", description="kv: KV memory-time; count: active requests (LYREO-Count)."
    )


@dataclass(frozen=True)
class Terms:
    """One request's Lyapunov terms per candidate, in `RequestSlot.servers` order.

    `latency`: the kit's estimate (s); `balance`: the change of sum_j Z_j Y_j
    the request causes there (0 without the balance term); `loads`: W_s before
    it; `z`: the virtual queues; `epsilon`: the tolerated deviation.
    """

    latency: Sequence[float]
    balance: Sequence[float]
    loads: Sequence[float]
    z: Sequence[float]
    epsilon: float


class RequestLearner(Protocol):
    """The seam of LYREO's learned scheduler: one decision per request.

    `decide` returns the index of the chosen server in `slot.servers`;
    `observe` receives finished requests (their `id` is the arrival's
    `request`), whose latencies are the delayed part of the reward.
    """

    def decide(self, slot: RequestSlot, a: Arrival, tokens: int, terms: Terms) -> int: ...

    def observe(self, records: Sequence[RequestRecord]) -> None: ...


class LyreoRequestRouter:
    """Per-request drift-plus-penalty routing; stateful through the virtual queues Z.

    With a `learner`, the learner picks each request's server from the same terms.
    """

    def __init__(
        self, name: str, params: LyreoRequestParams, learner: RequestLearner | None = None
    ) -> None:
        self.name = name
        self.p = params
        self.learner = learner
        self.z: dict[str, float] = {}
        self.capabilities = Capabilities(
            routes_requests=True, window_s=params.window_s, window_requests=params.window_requests
        )
        self._z_slot: int | None = None  # the slot whose windows the queues last moved for

    def terms(self, slot: RequestSlot, tokens: int) -> Terms:
        """The request's `Terms` at each candidate of `slot`."""
        by_count = self.p.workload == "count"
        servers = slot.servers
        loads = [s.count_load if by_count else s.kv_load for s in servers]
        z = [self.z.get(s.name, 0.0) for s in servers]
        latency = [slot.latency_s(k, tokens) for k in range(len(servers))]
        balance = [0.0] * len(servers)
        if self.p.balance and any(z):  # with every Z_j = 0 the balance term is 0
            # row k: the loads with the request at k, less their mean; all k at once
            w, zs = np.array(loads), np.array(z)
            add = np.array(
                [
                    slot.count_work(k) if by_count else slot.kv_work(k, tokens, latency[k])
                    for k in range(len(servers))
                ]
            )
            after = np.tile(w, (len(w), 1))
            after[np.diag_indices(len(w))] += add
            n = len(w)
            dev = np.abs(after - (after.sum(axis=1, keepdims=True) / n))
            now = float(zs @ np.abs(w - w.sum() / n))
            balance = (dev @ zs - now).tolist()
        return Terms(latency, balance, loads, z, self.p.epsilon)

    def route(self, obs: SlotObservation) -> Decision[RoutingMap]:
        """The slot's map (`kit.requests.slot_map`) by the rule, with Z as it stands."""
        tau = obs.context.loop.tau_s
        return slot_map(obs, self.name, lambda slot, a, tokens: self._rule(slot, tokens, tau))

    def route_requests(self, window: RequestWindow) -> list[Route]:
        """One route per request of the window; Z moves at the slot's first window."""
        tau = window.context.loop.tau_s
        fresh = window.slot != self._z_slot
        self._z_slot = window.slot

        def choose(slot: RequestSlot, a: Arrival, tokens: int) -> int:
            if self.learner is not None:
                return self.learner.decide(slot, a, tokens, self.terms(slot, tokens))
            return self._rule(slot, tokens, tau)

        return route_window(window, choose, self._update_queues if fresh else None)

    def _update_queues(self, slots: Mapping[str, RequestSlot]) -> None:
        by_count = self.p.workload == "count"
        loads: dict[str, float] = {}
        for slot in slots.values():
            for s in slot.servers:
                w = s.count_load if by_count else s.kv_load
                loads[s.name] = loads.get(s.name, 0.0) + w
        self.z.update(next_virtual_queues(self.z, load_deviations(loads), self.p.epsilon))

    def _rule(self, slot: RequestSlot, tokens: int, tau: float) -> int:
        """The drift-plus-penalty choice: the lowest nu latency / tau + balance change."""
        t = self.terms(slot, tokens)
        best, best_k = math.inf, 0
        for k in range(len(slot.servers)):
            score = self.p.nu * t.latency[k] / tau + t.balance[k]
            if score < best:
                best, best_k = score, k
        return best_k

    def observe(self, records: Sequence[RequestRecord]) -> None:
        if self.learner is not None:
            self.learner.observe(records)


def build_request_router(name: str, params: Mapping[str, Any]) -> LyreoRequestRouter:
    """Factory of `lyreo-ly` and its ablations (`VARIANTS`): their fixed parameters win."""
    fixed = VARIANTS[name]
    clash = sorted(k for k in fixed if k in params and params[k] != fixed[k])
    if clash:
        raise ConfigError(f"router {name}: {', '.join(clash)} is fixed by the ablation")
    return LyreoRequestRouter(name, parse_params(LyreoRequestParams, {**params, **fixed}, name))
