"""LYREO's learning step (torch, CPU): reward redistribution by an LSTM return predictor, then PPO.

After each episode (`Trajectory`, rewards r_i = -cost_i / scale):

0. Actor. logit_s = MLP(row_s), plus -score_s / temperature for a residual
   actor (`actor.CandidateScorer`; the trajectory carries that prior), whose
   MLP starts with its last layer at zero: PPO learns a correction to the
   variant's greedy instead of a policy from scratch (lmedge's addition: from
   scratch, 19 episodes left the argmax far worse than the greedy).
1. Values. The critic scores every step: V(s_i), from the candidates' rows
   (a per-candidate MLP, mean- and max-pooled, so any number of servers).
2. Redistribution (variant `lyreo`; seed §IV-B2). The steps are cut into
   windows of H decisions. A window's target is its truncated, bootstrapped
   return G = sum_{k<H} gamma^k r_{w+k} + gamma^H V(s_{w+H}) (no bootstrap
   at the episode's end). A 2-layer LSTM reads the window's state-action
   sequence (the chosen candidate's row and the mean row) and is trained to
   predict G at every step; the redistributed reward of step k is the
   increment of the prediction, g_k - g_{k-1} (g_{w-1} = 0), and the last
   step of a window also takes G - g_last, so each window keeps its return.
   The bootstrap is inside G, so GAE treats the window's end as terminal.
   `ly-ppo` and `ppo-fixed` skip this and learn from r as observed.
3. PPO (§IV-B3): advantages by GAE(gamma, lambda), normalized; clipped
   surrogate, critic regression to the GAE returns, entropy bonus; a few
   epochs of minibatches.

Rewards are divided by a running scale (the mean of the episodes' standard
deviations of r), so the same learning rate suits any cost magnitude.
Not here: acting (`rollout`, numpy) and the policy file (`actor`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from lmedge.policies.lyreo.learning.actor import Layer, NumpyActor
from lmedge.policies.lyreo.learning.features import WIDTH
from lmedge.policies.lyreo.learning.params import LearnerParams
from lmedge.policies.lyreo.learning.rollout import Trajectory

Array = np.ndarray[Any, Any]


def _mlp(width: int, hidden: int, out: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Linear(width, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(),
        nn.Linear(hidden, out),
    )  # fmt: skip


class ActorCritic(nn.Module):
    """Actor: a logit per candidate row (+ the prior). Critic: pooled embeddings -> V(s).

    `residual`: the actor's last layer starts at zero (its first argmax is the
    prior's, the greedy); otherwise near zero (a near-uniform first policy).
    """

    def __init__(self, hidden: int, residual: bool = False) -> None:
        super().__init__()
        self.actor = _mlp(WIDTH, hidden, 1)
        self.embed = _mlp(WIDTH, hidden, hidden)
        self.value = nn.Linear(2 * hidden, 1)
        with torch.no_grad():
            last = self.actor[-1]
            assert isinstance(last, nn.Linear)
            last.weight.mul_(0.0 if residual else 0.01)
            last.bias.zero_()

    def logits(
        self, rows: torch.Tensor, mask: torch.Tensor, prior: torch.Tensor | None = None
    ) -> torch.Tensor:
        raw: torch.Tensor = self.actor(rows).squeeze(-1)
        if prior is not None:
            raw = raw + prior
        return raw.masked_fill(~mask, -1e9)

    def values(self, rows: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.embed(rows)
        m = mask.unsqueeze(-1).float()
        mean = (h * m).sum(1) / m.sum(1).clamp(min=1.0)
        top = h.masked_fill(~mask.unsqueeze(-1), -1e9).max(1).values
        v: torch.Tensor = self.value(torch.cat([mean, top], -1)).squeeze(-1)
        return v

    def numpy_layers(self) -> list[Layer]:
        linear = [m for m in self.actor if isinstance(m, nn.Linear)]
        return [
            Layer(
                weight=m.weight.detach().double().T.tolist(), bias=m.bias.detach().double().tolist()
            )
            for m in linear
        ]


class ReturnPredictor(nn.Module):
    """g(s_0, a_0, ..., s_k, a_k): the window's return predicted after each step (LSTM)."""

    def __init__(self, hidden: int, layers: int) -> None:
        super().__init__()
        self.lstm = nn.LSTM(2 * WIDTH, hidden, num_layers=layers, batch_first=True)
        self.head = nn.Linear(hidden, 1)

    def forward(self, seq: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(seq)
        g: torch.Tensor = self.head(out).squeeze(-1)
        return g


def gae(rewards: Array, values: Array, ends: Array, gamma: float, lam: float) -> Array:
    """Generalized advantage estimates; `ends[i]` True when step i is terminal (no bootstrap)."""
    adv = np.zeros_like(rewards)
    last = 0.0
    for i in range(rewards.size - 1, -1, -1):
        nxt = 0.0 if ends[i] else values[i + 1]
        delta = rewards[i] + gamma * nxt - values[i]
        last = delta + gamma * lam * (0.0 if ends[i] else last)
        adv[i] = last
    return adv


class Trainer:
    """The networks and optimizers of one training, updated after each episode."""

    def __init__(self, params: LearnerParams, seed: int) -> None:
        # One thread: the networks are small, and on a shared machine torch's
        # thread pool spins against the emulator (and is not reproducible across counts).
        torch.set_num_threads(1)
        torch.manual_seed(seed)
        self.p = params
        self.net = ActorCritic(params.hidden, params.residual)
        self.opt = torch.optim.Adam(self.net.parameters(), lr=params.lr)
        self.predictor = ReturnPredictor(params.lstm_hidden, params.lstm_layers)
        self.predictor_opt = torch.optim.Adam(self.predictor.parameters(), lr=1e-3)
        self.scale = 0.0
        self.episodes = 0

    def actor(self) -> NumpyActor:
        return NumpyActor([(np.array(x.weight), np.array(x.bias)) for x in self.net.numpy_layers()])

    def _rewards(self, traj: Trajectory) -> Array:
        r = -traj.observed_cost
        std = float(r.std()) or 1.0
        self.episodes += 1
        self.scale += (std - self.scale) / self.episodes
        return np.asarray(r / max(self.scale, 1e-8))

    def redistribute(self, traj: Trajectory, rewards: Array, values: Array) -> Array:
        """Rewards redistributed window by window (module docstring, step 2)."""
        n, h, g = len(traj), self.p.horizon, self.p.gamma
        rows = torch.from_numpy(traj.rows)
        mask = torch.from_numpy(traj.mask)
        chosen = rows[torch.arange(n), torch.from_numpy(traj.actions)]
        m = mask.unsqueeze(-1).float()
        mean = (rows * m).sum(1) / m.sum(1).clamp(min=1.0)
        steps = torch.cat([chosen, mean], -1)
        starts = list(range(0, n, h))
        seq = torch.zeros(len(starts), h, 2 * WIDTH)
        target = torch.zeros(len(starts))
        valid = torch.zeros(len(starts), h, dtype=torch.bool)
        for w, s in enumerate(starts):
            e = min(s + h, n)
            seq[w, : e - s] = steps[s:e]
            valid[w, : e - s] = True
            boot = g ** (e - s) * values[e] if e < n else 0.0
            target[w] = float(np.sum(rewards[s:e] * g ** np.arange(e - s))) + boot
        for _ in range(self.p.predictor_epochs):
            pred = self.predictor(seq)
            loss = ((pred - target.unsqueeze(1)) ** 2)[valid].mean()
            self.predictor_opt.zero_grad()
            loss.backward()
            self.predictor_opt.step()
        with torch.no_grad():
            pred = self.predictor(seq).numpy()
        out = np.empty(n)
        for w, s in enumerate(starts):
            e = min(s + h, n)
            p = pred[w, : e - s]
            out[s:e] = np.diff(p, prepend=0.0)
            out[e - 1] += float(target[w]) - p[-1]
        return out

    def update(self, traj: Trajectory) -> dict[str, float]:
        """One learning step on an episode; returns the last minibatch's losses."""
        n = len(traj)
        if n == 0:
            return {}
        rows, mask = torch.from_numpy(traj.rows), torch.from_numpy(traj.mask)
        prior = torch.from_numpy(traj.prior)
        actions, old = torch.from_numpy(traj.actions), torch.from_numpy(traj.logp)
        with torch.no_grad():
            values = self.net.values(rows, mask).double().numpy()
        rewards = self._rewards(traj)
        ends = np.zeros(n, dtype=bool)
        ends[-1] = True
        if self.p.variant == "lyreo":
            rewards = self.redistribute(traj, rewards, values)
            ends[self.p.horizon - 1 :: self.p.horizon] = True
        adv = gae(rewards, np.append(values, 0.0), ends, self.p.gamma, self.p.gae_lambda)
        returns = torch.from_numpy(adv + values).float()
        adv_t = torch.from_numpy((adv - adv.mean()) / (adv.std() + 1e-8)).float()
        order = torch.Generator().manual_seed(self.episodes)
        losses: dict[str, float] = {}
        for _ in range(self.p.ppo_epochs):
            perm = torch.randperm(n, generator=order)
            for start in range(0, n, self.p.minibatch):
                idx = perm[start : start + self.p.minibatch]
                logits = self.net.logits(rows[idx], mask[idx], prior[idx])
                logp_all = torch.log_softmax(logits, -1)
                logp = logp_all.gather(1, actions[idx].unsqueeze(1)).squeeze(1)
                ratio = torch.exp(logp - old[idx])
                a = adv_t[idx]
                clip = torch.clamp(ratio, 1 - self.p.clip, 1 + self.p.clip)
                policy = -torch.min(ratio * a, clip * a).mean()
                prob = logp_all.exp() * mask[idx]
                entropy = -(prob * logp_all.masked_fill(~mask[idx], 0.0)).sum(-1).mean()
                value = ((self.net.values(rows[idx], mask[idx]) - returns[idx]) ** 2).mean()
                loss = policy + self.p.value_coef * value - self.p.entropy * entropy
                self.opt.zero_grad()
                loss.backward()  # type: ignore[no-untyped-call]
                nn.utils.clip_grad_norm_(self.net.parameters(), 0.5)
                self.opt.step()
                losses = {
                    "policy": policy.item(),
                    "value": value.item(),
                    "entropy": entropy.item(),
                }
        return losses
