"""PerLLM's UCB routing bandit (Yang et al. 2024, as instantiated in the paper §VI).

One UCB1 bandit per (origin, LM) pair; its arms are the LM's feasible
destination nodes. Each slot every pair with arrivals pulls one arm: all of the
pair's requests that slot go to it. The reward of a request is

    r = 1 - min(d / tau, 1)

with d its end-to-end delay and tau its deadline (a timeout scores 0). Rewards
arrive only when a request completes or times out, so each pull waits in a
*pending-reward queue* keyed by (slot, origin, LM) until its records come back
through `observe`. Arm choice:

1. arms never rewarded are tried first, cycling through them from a seeded
   offset (so delayed feedback does not make every slot re-pick the same
   unexplored arm);
2. otherwise UCB1: argmax mean_a + c * sqrt(2 ln N / n_a), N and n_a counting
   received rewards.

Stateful by design (a learner), but still pure: no clock, no I/O.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import Field

from lmedge.api import ClusterContext, Decision, RequestRecord, Route, RoutingMap, SlotObservation
from lmedge.policies.kit.params import PluginParams, parse_params

NAME = "perllm-ucb"


class PerLLMParams(PluginParams):
    exploration: float = Field(
        default=1.0, ge=0, description="c: scale of the UCB1 bonus sqrt(2 ln N / n_a)."
    )


@dataclass
class Arm:
    pulls: int = 0
    rewards: int = 0
    total: float = 0.0

    @property
    def mean(self) -> float:
        return self.total / self.rewards if self.rewards else 0.0


class Bandit:
    """UCB1 over one (origin, LM) pair's destinations.

    Arms are created lazily (a 1,000-node cluster has 1,000 arms per pair);
    unexplored arms are visited in a cycle from a seeded offset, skipping arms
    that already have a reward, which is "fewest pending pulls first".
    """

    def __init__(self, order: Sequence[str], offset: int) -> None:
        self.order = order
        self.offset = offset
        self.cursor = 0
        self.arms: dict[str, Arm] = {}
        self.rewarded = 0

    def arm(self, name: str) -> Arm:
        a = self.arms.get(name)
        if a is None:
            a = self.arms[name] = Arm()
        return a

    def credit(self, name: str, value: float) -> None:
        a = self.arm(name)
        if a.rewards == 0:
            self.rewarded += 1
        a.rewards += 1
        a.total += value

    def choose(self, c: float) -> str:
        n_arms = len(self.order)
        if self.rewarded < n_arms:
            for _ in range(n_arms):
                name = self.order[(self.offset + self.cursor) % n_arms]
                self.cursor += 1
                if self.arms.get(name, _NO_ARM).rewards == 0:
                    return name
        n = sum(a.rewards for a in self.arms.values())
        log_n = math.log(max(n, 1))

        def ucb(name: str) -> float:
            a = self.arms[name]
            return a.mean + c * math.sqrt(2 * log_n / a.rewards)

        return max(self.order, key=ucb)


_NO_ARM = Arm()


@dataclass
class Pending:
    """A pull waiting for its rewards: the arm, and requests not yet finished."""

    destination: str
    outstanding: int


def reward(record: RequestRecord, tau_s: float) -> float:
    """1 - min(d / tau, 1); a timeout is worth 0."""
    if record.outcome != "success":
        return 0.0
    return 1.0 - min(record.latency_s / tau_s, 1.0)


class PerLLMRouter:
    """The `perllm-ucb` router plugin; also a `FeedbackConsumer`."""

    name = NAME

    def __init__(self, context: ClusterContext, seed: int, params: PerLLMParams) -> None:
        self.context = context
        self.params = params
        self.rng = random.Random(seed)
        self.bandits: dict[tuple[str, str], Bandit] = {}
        self._feasible: dict[str, list[str]] = {}
        #: The pending-reward queue, by (slot, origin, LM).
        self.pending: dict[tuple[int, str, str], Pending] = {}

    def bandit(self, origin: str, lm: str) -> Bandit | None:
        key = (origin, lm)
        if key not in self.bandits:
            if lm not in self._feasible:
                self._feasible[lm] = self.context.feasible_nodes(lm)
            nodes = self._feasible[lm]
            if not nodes:
                return None
            self.bandits[key] = Bandit(nodes, self.rng.randrange(len(nodes)))
        return self.bandits[key]

    def route(self, obs: SlotObservation) -> Decision[RoutingMap]:
        routes: list[Route] = []
        for a in obs.arrivals:
            if a.requests == 0:
                continue
            bandit = self.bandit(a.origin, a.lm)
            if bandit is None:
                continue
            dest = bandit.choose(self.params.exploration)
            bandit.arm(dest).pulls += 1
            self.pending[(obs.slot, a.origin, a.lm)] = Pending(dest, a.requests)
            routes.append(Route(origin=a.origin, lm=a.lm, destination=dest))
        return Decision[RoutingMap](
            agent="scheduler", policy=NAME, source="rule", value=RoutingMap(routes=routes)
        )

    def observe(self, records: Sequence[RequestRecord]) -> None:
        """Credit each finished request to the arm that was pulled for it."""
        for r in records:
            key = (r.slot, r.origin, r.lm)
            entry = self.pending.get(key)
            dest = entry.destination if entry is not None else r.destination
            bandit = self.bandits.get((r.origin, r.lm))
            if bandit is None or dest not in self._feasible.get(r.lm, ()):
                continue
            bandit.credit(dest, reward(r, self.context.deadline_s(r.lm)))
            if entry is not None:
                entry.outstanding -= 1
                if entry.outstanding <= 0:
                    del self.pending[key]
            else:
                # A request routed by someone else (e.g. the loop's fallback): still evidence.
                bandit.arm(dest).pulls += 1


def build(context: ClusterContext, seed: int, params: Mapping[str, Any]) -> PerLLMRouter:
    return PerLLMRouter(context, seed, parse_params(PerLLMParams, params, NAME))
