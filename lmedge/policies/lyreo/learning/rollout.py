"""Collecting an episode of LYREO's sequence-MDP behind the router's learner seam.

Each batch the router scores is one step: the state is the candidates'
feature rows (`features`), the action the candidate taken, sampled from the
actor's softmax over the feasible candidates (or its argmax when evaluating).
Its cost, what the learner minimizes, has the seed's three parts:

    cost_i = nu * sum_r K_r * latency_r / deadline     (delayed: known when r finishes)
           + balance_i                                 (Lyapunov: the router's Z-weighted
                                                        change of sum_s Z_s Y_s; ppo-fixed:
                                                        fixed_penalty * (W_s - mean W))
           + memory_penalty * 10 * max(kv_s - 0.9, 0)  (feasibility: KV share in use)

over the requests r of the batch (a failed request counts its full deadline).
The immediate parts are known at the step; the latency part arrives in
`observe` when the requests finish, and is booked twice: to the step whose
requests they were (`true_cost`, for reporting) and to the latest step taken
so far (`observed_cost`, the delayed reward stream PPO learns from; what is
still outstanding at the end lands on the last step, as in the seed).

Not here: the updates (`ppo`, torch).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from lmedge.api import RequestRecord, SlotObservation
from lmedge.policies.lyreo.learning.actor import NumpyActor, pick
from lmedge.policies.lyreo.learning.features import WIDTH, SlotFeatures
from lmedge.policies.lyreo.learning.params import LearnerParams
from lmedge.policies.lyreo.router import Candidate

Array = np.ndarray[Any, Any]
#: KV share above which the feasibility penalty starts.
KV_HIGH = 0.9


@dataclass(frozen=True)
class Trajectory:
    """One episode's steps, padded to the widest candidate set."""

    rows: Array  # (N, M, WIDTH)
    mask: Array  # (N, M) feasible candidates
    actions: Array  # (N,)
    logp: Array  # (N,) log-probability of the action when taken
    observed_cost: Array  # (N,) cost as the delayed reward stream delivers it
    true_cost: Array  # (N,) cost of each step's own requests

    def __len__(self) -> int:
        return int(self.actions.size)


class RolloutLearner:
    """A `LyreoLearner` that acts with a numpy actor and records the episode.

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
        self.actor = actor
        self.rng = rng
        self.sample = sample
        self.measured = measured_slots
        self._use_z = params.variant != "ppo-fixed"
        self._slot: SlotFeatures | None = None
        self._pending: tuple[Array, Array, int, float] | None = None
        self.rows: list[Array] = []
        self.masks: list[Array] = []
        self.actions: list[int] = []
        self.logp: list[float] = []
        self.observed: list[float] = []
        self.true: list[float] = []
        self._steps: dict[tuple[int, str, str], int] = {}
        self._z_sum, self._z_slots = 0.0, 0
        self._latency_sum, self._prompts, self._failed = 0.0, 0, 0

    def _features(self, obs: SlotObservation, z: Mapping[str, float]) -> SlotFeatures:
        if self._slot is None or self._slot.obs is not obs:
            self._slot = SlotFeatures(obs, z, self._use_z)
            if self.measured is None or obs.slot < self.measured:
                self._z_sum += self._slot.mean_z
                self._z_slots += 1
        return self._slot

    def bias(
        self, obs: SlotObservation, z: Mapping[str, float], b: int, cands: Sequence[Candidate]
    ) -> Sequence[float]:
        rows, ok = self._features(obs, z).rows(b, cands)
        if not ok.any():
            ok[:] = True  # the greedy takes the first; the step is still recorded
        logits = np.where(ok, self.actor.logits(rows), -np.inf)
        logits -= logits.max()
        prob = np.exp(logits)
        prob /= prob.sum()
        j = int(self.rng.choice(len(cands), p=prob)) if self.sample else int(np.argmax(prob))
        self._pending = (rows, ok, j, math.log(max(prob[j], 1e-12)))
        return pick(len(cands), j)

    def record(
        self,
        obs: SlotObservation,
        z: Mapping[str, float],
        b: int,
        cands: Sequence[Candidate],
        chosen: str,
    ) -> None:
        assert self._pending is not None, "record without bias"
        rows, ok, j, logp = self._pending
        self._pending = None
        j = (
            next(i for i, c in enumerate(cands) if c.node == chosen)
            if cands[j].node != chosen
            else j
        )
        feats, a, c = self._features(obs, z), obs.arrivals[b], cands[j]
        if self._use_z:
            balance = c.balance if math.isfinite(c.balance) else 0.0
        else:
            balance = self.p.fixed_penalty * feats.deviation(c.node)
        memory = self.p.memory_penalty * 10 * max(feats.kv_usage(c.node, a.lm) - KV_HIGH, 0.0)
        self._steps[(obs.slot, a.origin, a.lm)] = len(self.actions)
        self.rows.append(rows)
        self.masks.append(ok)
        self.actions.append(j)
        self.logp.append(logp)
        self.observed.append(balance + memory)
        self.true.append(balance + memory)

    def observe(self, records: Sequence[RequestRecord]) -> None:
        if not self.actions:
            return
        last = len(self.actions) - 1
        for r in records:
            step = self._steps.get((r.slot, r.origin, r.lm))
            if step is None:
                continue
            deadline = self._slot.obs.context.deadline_s(r.lm) if self._slot else 1.0
            ok = r.outcome == "success"
            latency = min(r.latency_s, deadline) if ok else deadline
            cost = self.p.nu * max(r.prompts, 1) * latency / deadline
            self.observed[last] += cost
            self.true[step] += cost
            if self.measured is None or r.slot < self.measured:
                self._latency_sum += max(r.prompts, 1) * latency
                self._prompts += max(r.prompts, 1)
                self._failed += 0 if ok else max(r.prompts, 1)

    def trajectory(self) -> Trajectory:
        n = len(self.actions)
        width = max((len(r) for r in self.rows), default=1)
        rows = np.zeros((n, width, WIDTH), dtype=np.float32)
        mask = np.zeros((n, width), dtype=bool)
        for i, (r, m) in enumerate(zip(self.rows, self.masks, strict=True)):
            rows[i, : len(r)] = r
            mask[i, : len(m)] = m
        return Trajectory(
            rows=rows,
            mask=mask,
            actions=np.array(self.actions, dtype=np.int64),
            logp=np.array(self.logp, dtype=np.float32),
            observed_cost=np.array(self.observed),
            true_cost=np.array(self.true),
        )

    def stats(self) -> dict[str, float | int]:
        """Mean latency per prompt (failures at the deadline), failure share, mean Z, mean cost."""
        prompts = max(self._prompts, 1)
        return {
            "mean_latency_s": self._latency_sum / prompts,
            "failure_share": self._failed / prompts,
            "mean_z": self._z_sum / max(self._z_slots, 1),
            "mean_cost": float(np.mean(self.true)) if self.true else 0.0,
            "decisions": len(self.actions),
        }
