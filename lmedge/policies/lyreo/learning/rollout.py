"""Collecting an episode of LYREO's sequence-MDP behind the per-request router's learner seam.

Each request the router routes is one step: the state is the candidate
servers' feature rows (`features`) (and, for a residual actor, their greedy
scores), the action the server taken, sampled from the actor's softmax (or
its argmax when evaluating). Its cost, what the
learner minimizes, has the seed's three parts:

    cost_i = nu * latency_i / deadline                 (delayed: known when request i finishes;
                                                        a failure counts its full deadline)
           + balance_i / epsilon                       (Lyapunov: the change of sum_s Z_s Y_s the
                                                        request causes; ppo-fixed:
                                                        fixed_penalty * (W_s - mean W) / epsilon)
           + memory_penalty * 10 * max(kv_s - 0.9, 0)  (feasibility: KV-pool share in use at s)

The balance terms are read over epsilon (W and Z are fractions of memory-time
near epsilon, the latency part is a fraction of the deadline), so neither
part vanishes against the other. The immediate parts are known at the step;
the latency part arrives in `observe` when the request finishes, matched to
its step by the request id (`RequestRecord.id` = `Arrival.request`), and is
booked twice: to that step (`true_cost`, for reporting) and to the latest
step taken so far (`observed_cost`, the delayed reward stream PPO learns
from; what is still outstanding at the end lands on the last step, as in
the seed).

Not here: the updates (`ppo`, torch).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from lmedge.api import Arrival, RequestRecord
from lmedge.policies.kit.requests import RequestSlot
from lmedge.policies.lyreo.learning.actor import CandidateScorer, NumpyActor
from lmedge.policies.lyreo.learning.features import WIDTH
from lmedge.policies.lyreo.learning.params import LearnerParams
from lmedge.policies.lyreo.perrequest import Terms

Array = np.ndarray[Any, Any]
#: KV share above which the feasibility penalty starts.
KV_HIGH = 0.9


@dataclass(frozen=True)
class Trajectory:
    """One episode's steps, padded to the widest candidate set."""

    rows: Array  # (N, M, WIDTH)
    mask: Array  # (N, M) candidates present
    prior: Array  # (N, M) the residual actor's -score / temperature (zeros if not residual)
    actions: Array  # (N,)
    logp: Array  # (N,) log-probability of the action when taken
    observed_cost: Array  # (N,) cost as the delayed reward stream delivers it
    true_cost: Array  # (N,) cost of each step's own request

    def __len__(self) -> int:
        return int(self.actions.size)


class RolloutLearner:
    """A `RequestLearner` that acts with a numpy actor and records the episode.

    `measured_slots`: requests of later slots (the settle phase) still drive
    learning but are left out of the episode statistics.
    """

    def __init__(
        self,
        params: LearnerParams,
        actor: NumpyActor,
        rng: np.random.Generator,
        *,
        sample: bool = True,
        measured_slots: int | None = None,
    ) -> None:
        self.p = params
        self.score = CandidateScorer(actor, params)
        self.rng = rng
        self.sample = sample
        self.measured = measured_slots
        self._use_z = params.variant != "ppo-fixed"
        self.rows: list[Array] = []
        self.prior: list[Array] = []
        self.actions: list[int] = []
        self.logp: list[float] = []
        self.observed: list[float] = []
        self.true: list[float] = []
        self._steps: dict[str, tuple[int, float]] = {}  # request id -> (step, deadline)
        self._slot_z: dict[int, float] = {}
        self._latency_sum, self._requests, self._failed = 0.0, 0, 0

    def decide(self, slot: RequestSlot, a: Arrival, tokens: int, terms: Terms) -> int:
        rows, prior, logits = self.score(slot, tokens, terms)
        logits -= logits.max()
        prob = np.exp(logits)
        prob /= prob.sum()
        j = int(self.rng.choice(len(prob), p=prob)) if self.sample else int(np.argmax(prob))
        if self._use_z:
            balance = terms.balance[j]
        else:
            mean = math.fsum(terms.loads) / len(terms.loads)
            balance = self.p.fixed_penalty * (terms.loads[j] - mean)
        s = slot.servers[j]
        memory = self.p.memory_penalty * 10 * max(s.kv_usage() - KV_HIGH, 0.0)
        cost = balance / max(terms.epsilon, 1e-12) + memory
        if a.request is not None:
            self._steps[a.request] = (len(self.actions), slot.deadline_s)
        if self.measured is None or slot.slot < self.measured:
            self._slot_z.setdefault(slot.slot, math.fsum(terms.z) / max(len(terms.z), 1))
        self.rows.append(rows)
        self.prior.append(prior)
        self.actions.append(j)
        self.logp.append(math.log(max(float(prob[j]), 1e-12)))
        self.observed.append(cost)
        self.true.append(cost)
        return j

    def observe(self, records: Sequence[RequestRecord]) -> None:
        if not self.actions:
            return
        last = len(self.actions) - 1
        for r in records:
            got = self._steps.pop(r.id, None)
            if got is None:
                continue
            step, deadline = got
            ok = r.outcome == "success"
            latency = min(r.latency_s, deadline) if ok else deadline
            cost = self.p.nu * latency / deadline
            self.observed[last] += cost
            self.true[step] += cost
            if self.measured is None or r.slot < self.measured:
                self._latency_sum += latency
                self._requests += 1
                self._failed += 0 if ok else 1

    def trajectory(self) -> Trajectory:
        n = len(self.actions)
        width = max((len(r) for r in self.rows), default=1)
        rows = np.zeros((n, width, WIDTH), dtype=np.float32)
        mask = np.zeros((n, width), dtype=bool)
        prior = np.zeros((n, width), dtype=np.float32)
        for i, (r, q) in enumerate(zip(self.rows, self.prior, strict=True)):
            rows[i, : len(r)] = r
            mask[i, : len(r)] = True
            prior[i, : len(q)] = q
        return Trajectory(
            rows=rows,
            mask=mask,
            prior=prior,
            actions=np.array(self.actions, dtype=np.int64),
            logp=np.array(self.logp, dtype=np.float32),
            observed_cost=np.array(self.observed),
            true_cost=np.array(self.true),
        )

    def stats(self) -> dict[str, float | int]:
        """Mean latency per request (failures at the deadline), failure share, mean Z, mean cost."""
        requests = max(self._requests, 1)
        return {
            "mean_latency_s": self._latency_sum / requests,
            "failure_share": self._failed / requests,
            "mean_z": math.fsum(self._slot_z.values()) / max(len(self._slot_z), 1),
            "mean_cost": float(np.mean(self.true)) if self.true else 0.0,
            "decisions": len(self.actions),
        }
