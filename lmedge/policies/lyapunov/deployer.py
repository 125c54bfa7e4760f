"""Lyapunov drift-plus-penalty deployer (paper §VI, the deployer of RL/AL/LL/MAL/PerLLM).

Per node and slot it picks, among the node's feasible actions `a` (per LM: off,
cpu with the default cores, or gpu with 1..max vGPUs), the one maximizing

    score(a) = sum_i Q_ni * mu_ni(a) - V * (C_gpu(a) + C_churn(a))

    mu_ni(a)  = alpha_gpu_i * v_i^beta * f_gpu(eta_gpu)         i on gpu with v_i vGPUs
              = alpha_cpu_i * f_cpu(eta_cpu) * f_mem(eta_mem)  i on cpu
              = 0                                              i off
    C_gpu(a)  = pi(eta_gpu) * N_GPU(a),  pi(eta) = p0 + p1 eta + p2 eta^2
    f(eta)    = 1 / (1 + gamma eta)
    C_churn(a)= lambda_churn * sum_i |1[i active in a] - 1[i active now]| * (1 + kappa Q_ni)

eta is the node's measured utilization at slot t by default (the paper's
eta_n(t)), or the allocation of the action (`utilization: action`). See
README.md for the choices the paper leaves open (f, pi, eta). It does not
look at the planner's role intent: the paper's Lyapunov baselines deploy from
local queues alone, which is what separates MAL from MA.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
from pydantic import Field

from lmedge.api import (
    ClusterContext,
    Decision,
    LMPlacement,
    LMServiceSpec,
    Mode,
    NodeInfo,
    NodeObservation,
    Placement,
    ServiceInfo,
    check_placement,
    hosting,
    nearest_feasible,
)
from lmedge.api.constants import SLOT_S
from lmedge.policies.kit.params import PluginParams, parse_params

NAME = "lyapunov"
#: The paper's slot length (s), the unit of its alphas (prompts per slot).
PAPER_SLOT_S = SLOT_S

#: The paper's calibrated service-rate weights (§VI), (alpha_gpu, alpha_cpu) per
#: model, keyed by the model id's last path segment, lower-cased. They are
#: policy parameters, fixed during the benchmark, not the emulator's physics.
PAPER_ALPHAS: dict[str, tuple[float, float]] = {
    "gpt2": (5.80, 3.68),  # LM1
    "gpt2-large": (7.20, 1.00),  # LM2
    "blip-image-captioning-base": (5.61, 0.0),  # LM3
    "stable-diffusion-v1-5": (3.02, 0.0),  # LM4
}
#: The paper's model whose weights stand in for an unknown model of a modality:
#: text outputs and audio behave like the small text model, images like BLIP
#: (image in, text out) or Stable Diffusion (image out).
MODALITY_CLASS: dict[str, str] = {
    "text-to-text": "gpt2",
    "audio-to-text": "gpt2",
    "text-to-audio": "gpt2",
    "image-to-text": "blip-image-captioning-base",
    "text-to-image": "stable-diffusion-v1-5",
    "image-to-image": "stable-diffusion-v1-5",
}
#: alpha_cpu of an unknown cpu-or-gpu model whose modality class has none: the
#: paper's smallest positive CPU weight (GPT-2-large's), the cautious choice.
FALLBACK_ALPHA_CPU = 1.00


class LyapunovParams(PluginParams):
    """Drift-plus-penalty coefficients; defaults are the paper's calibrated set."""

    v: float = Field(default=1.0, ge=0, description="V: weight of cost against backlog reward.")
    p0: float = Field(default=0.0, ge=0, description="GPU price intercept per vGPU.")
    p1: float = Field(default=0.15, ge=0, description="GPU price slope in eta_gpu.")
    p2: float = Field(default=0.30, ge=0, description="GPU price curvature in eta_gpu^2.")
    lambda_churn: float = Field(default=0.10, ge=0, description="Cost per activation change.")
    kappa: float = Field(default=1.0, ge=0, description="Backlog weight of the churn cost.")
    alpha_gpu: dict[str, float] = Field(
        default_factory=dict,
        description="Prompts per slot on GPU per LM name; overrides `alpha_default`.",
    )
    alpha_cpu: dict[str, float] = Field(
        default_factory=dict,
        description="Prompts per slot on CPU per LM name; overrides `alpha_default`.",
    )
    alpha_default: Literal["paper", "profile"] = Field(
        default="paper",
        description=(
            "alpha of an LM not in alpha_gpu/alpha_cpu: the paper's fixed weights (by model, "
            "else by modality class), or slot_s / secondsPerPrompt from the LM's profile."
        ),
    )
    cpu_contention: float = Field(
        default=0.25, ge=0, description="gamma of f(eta) = 1/(1 + gamma eta) for CPU and memory."
    )
    vgpu_speedup: float = Field(
        default=0.0,
        ge=0,
        le=1,
        description="beta: rate grows as vGPUs^beta; 0 = time-slicing adds no share.",
    )
    utilization: Literal["observed", "action"] = Field(
        default="observed",
        description="eta from the node's measured utilization (paper) or the action's allocation.",
    )
    max_enumeration: int = Field(
        default=4096, ge=1, description="Exhaustive search up to this many actions, else local."
    )


#: Action counts up to which `exhaustive` scans in Python: below it numpy's
#: per-call overhead costs more than the scan.
SCAN_AT_MOST = 32


@dataclass(frozen=True)
class _Option:
    """One LM's action: mode, cores, vGPUs, and the resources it takes."""

    mode: Mode
    cores: float
    vgpus: int
    memory: float
    vram: float

    @property
    def active(self) -> bool:
        return self.mode != "off"


_OFF = _Option("off", 0.0, 0, 0.0, 0.0)


def contention(eta: float, gamma: float) -> float:
    """f(eta) = 1 / (1 + gamma * eta): 1 on an idle node, 1/(1+gamma) fully allocated."""
    return 1.0 / (1.0 + gamma * eta)


def model_key(model: str) -> str:
    """`PAPER_ALPHAS` key of a model id: `org/Stable-Diffusion-v1-5` -> `stable-diffusion-v1-5`."""
    return model.rsplit("/", 1)[-1].lower()


def paper_alpha(spec: LMServiceSpec) -> tuple[float, float]:
    """(alpha_gpu, alpha_cpu) of one LM under the paper's fixed weights.

    The paper's four models get their calibrated weights; any other model the
    weights of the paper's model of its modality class (`MODALITY_CLASS`), with
    alpha_cpu = 0 for a gpu-only LM and `FALLBACK_ALPHA_CPU` for a cpu-or-gpu
    LM whose class has no CPU weight.
    """
    key = model_key(spec.model)
    gpu, cpu = PAPER_ALPHAS.get(key) or PAPER_ALPHAS[MODALITY_CLASS[spec.modality]]
    if spec.runs_on != "cpu-or-gpu":
        return gpu, 0.0
    return gpu, cpu if cpu > 0 else FALLBACK_ALPHA_CPU


def profile_alphas(
    services: Sequence[ServiceInfo], slot_s: float = PAPER_SLOT_S
) -> tuple[dict[str, float], dict[str, float]]:
    """alpha per LM from the profile: prompts one uncontended instance completes per slot."""
    gpu = {s.name: slot_s / s.spec.profile.gpu_seconds_per_prompt for s in services}
    cpu = {
        s.name: (
            slot_s / s.spec.profile.cpu_seconds_per_prompt
            if s.spec.runs_on == "cpu-or-gpu" and s.spec.profile.cpu_seconds_per_prompt
            else 0.0
        )
        for s in services
    }
    return gpu, cpu


def default_alphas(
    services: Sequence[ServiceInfo],
    slot_s: float = PAPER_SLOT_S,
    source: Literal["paper", "profile"] = "paper",
) -> tuple[dict[str, float], dict[str, float]]:
    """(alpha_gpu, alpha_cpu) per LM name before any per-LM override.

    `paper` (the default): the paper's fixed weights (`paper_alpha`), given in
    prompts per 30-s slot and rescaled to `slot_s` (unchanged at 30 s).
    `profile`: `profile_alphas(services, slot_s)`.
    """
    if source == "profile":
        return profile_alphas(services, slot_s)
    scale = slot_s / PAPER_SLOT_S
    pairs = {s.name: paper_alpha(s.spec) for s in services}
    return (
        {n: g * scale for n, (g, _) in pairs.items()},
        {n: c * scale for n, (_, c) in pairs.items()},
    )


class LyapunovDeployer:
    """The `lyapunov` deployer plugin (pure; no state between slots)."""

    name = NAME

    def __init__(self, params: LyapunovParams) -> None:
        self.params = params

    def place(self, obs: NodeObservation) -> Decision[Placement]:
        placement = self.best_placement(obs)
        return Decision[Placement](
            agent="deployer", policy=NAME, source="rule", value=placement, node=obs.node.name
        )

    # -- the search ----------------------------------------------------------

    def best_placement(self, obs: NodeObservation) -> Placement:
        node, services = obs.node, obs.services
        if node.spec.role != "worker":
            return Placement(node=node.name, lms=[_lm(s.name, _OFF) for s in services])
        scorer = _Scorer(self.params, obs)
        choices = [self._options(node, s, scorer, i) for i, s in enumerate(services)]
        size = math.prod(len(c) for c in choices)
        if size <= self.params.max_enumeration:
            best = scorer.exhaustive(choices)
        else:
            best = scorer.local_search(choices)
        placement = Placement(
            node=node.name, lms=[_lm(s.name, o) for s, o in zip(services, best, strict=True)]
        )
        if check_placement(placement, node, services):
            # Unreachable while `_Scorer.feasible` mirrors check_placement; kept as a guard.
            return nearest_feasible(placement, node, services)
        return placement

    def _options(self, node: NodeInfo, s: ServiceInfo, scorer: _Scorer, i: int) -> list[_Option]:
        """The LM's candidate actions, minus those that can never be optimal."""
        spec, lm = node.spec, s.spec
        cores = lm.default_cpu_cores
        active: list[_Option] = []
        modes = hosting.modes(spec, lm)
        fits = cores <= spec.cpu_cores  # this deployer sizes every pod at the default cores
        if fits and "gpu" in modes:
            top = min(lm.max_vgpus, spec.total_vgpus)
            # With beta = 0 more vGPUs buy no service rate, only price and contention.
            top = top if self.params.vgpu_speedup > 0 else 1
            active += [
                _Option("gpu", cores, v, lm.deployment_memory_gib, lm.min_vram_gib)
                for v in range(1, top + 1)
            ]
        if fits and "cpu" in modes and scorer.alpha_cpu[i] > 0:
            active.append(_Option("cpu", cores, 0, lm.deployment_memory_gib, 0.0))
        if scorer.queue[i] > 0:
            return [_OFF, *active]
        if not scorer.was_active[i]:
            # No backlog: activating earns nothing and pays churn, so off dominates.
            return [_OFF]
        # No backlog but running: off (pays churn) or the cheapest way to keep it.
        cheapest = min(active, key=lambda o: (o.vgpus, o.cores), default=None)
        return [_OFF] if cheapest is None else [_OFF, cheapest]


class _Scorer:
    """Evaluates complete actions on one node; holds the node's budgets and queues."""

    def __init__(self, params: LyapunovParams, obs: NodeObservation) -> None:
        self.p = params
        spec = obs.node.spec
        gpu_default, cpu_default = default_alphas(obs.services, obs.slot_s, params.alpha_default)
        names = [s.name for s in obs.services]
        self.alpha_gpu = [params.alpha_gpu.get(n, gpu_default[n]) for n in names]
        self.alpha_cpu = [params.alpha_cpu.get(n, cpu_default[n]) for n in names]
        self.queue = [float(obs.state.backlog.get(n, 0)) for n in names]
        running = {i.lm for i in obs.state.instances}
        self.was_active = [n in running for n in names]
        self.cap_cores, self.cap_mem = spec.cpu_cores, spec.memory_gib
        self.cap_vgpus, self.cap_vram = spec.total_vgpus, spec.total_vram_gib
        self.gamma_gpu = float(spec.vgpus_per_gpu - 1)
        state = obs.state
        #: Measured eta at slot t (paper: eta_n(t)); None = derive eta from the action.
        self.observed: tuple[float, float, float] | None = None
        if params.utilization == "observed":
            mem_used = (
                1.0 - state.free_memory_gib / spec.memory_gib if state.free_memory_gib else 0.0
            )
            self.observed = (state.gpu_util, state.cpu_util, min(max(mem_used, 0.0), 1.0))

    def feasible(self, action: Sequence[_Option]) -> bool:
        return (
            sum(o.cores for o in action) <= self.cap_cores + 1e-9
            and sum(o.memory for o in action) <= self.cap_mem + 1e-9
            and sum(o.vgpus for o in action) <= self.cap_vgpus
            and sum(o.vram for o in action if o.mode == "gpu") <= self.cap_vram + 1e-9
        )

    def score(self, action: Sequence[_Option]) -> float:
        p = self.p
        n_gpu = sum(o.vgpus for o in action)
        if self.observed is not None:
            eta_gpu, eta_cpu, eta_mem = self.observed
        else:
            eta_gpu = n_gpu / self.cap_vgpus if self.cap_vgpus else 0.0
            eta_cpu = sum(o.cores for o in action) / self.cap_cores
            eta_mem = sum(o.memory for o in action) / self.cap_mem
        f_gpu = contention(eta_gpu, self.gamma_gpu)
        f_cpu = contention(eta_cpu, p.cpu_contention) * contention(eta_mem, p.cpu_contention)
        reward = 0.0
        churn = 0.0
        for i, o in enumerate(action):
            if o.mode == "gpu":
                reward += self.queue[i] * self.alpha_gpu[i] * (o.vgpus**p.vgpu_speedup) * f_gpu
            elif o.mode == "cpu":
                reward += self.queue[i] * self.alpha_cpu[i] * f_cpu
            if o.active != self.was_active[i]:
                churn += 1.0 + p.kappa * self.queue[i]
        price = p.p0 + p.p1 * eta_gpu + p.p2 * eta_gpu * eta_gpu
        return reward - p.v * (price * n_gpu + p.lambda_churn * churn)

    def exhaustive(self, choices: Sequence[Sequence[_Option]]) -> tuple[_Option, ...]:
        """Best feasible action; ties go to the first enumerated (fewest resources).

        The actions of `itertools.product(*choices)` are scored as numpy
        columns, one LM at a time in LM order, so every sum is the same float64
        sum in the same order as `score` and `feasible` compute it, and the
        chosen action is the one the scalar scan (kept below as the reference
        the tests compare with) would choose: at 16 LMs it scores up to
        `max_enumeration` actions, which in Python took tens of ms per node.
        """
        if math.prod(len(c) for c in choices) <= SCAN_AT_MOST:
            return self.exhaustive_scan(choices)
        return self.exhaustive_arrays(choices)

    def exhaustive_arrays(self, choices: Sequence[Sequence[_Option]]) -> tuple[_Option, ...]:
        """`exhaustive` with the actions scored as numpy columns (see there)."""
        off: tuple[_Option, ...] = tuple(_OFF for _ in choices)
        best_score = self.score(off)
        shape = tuple(len(c) for c in choices)
        size = math.prod(shape)
        picks = np.unravel_index(np.arange(size), shape)  # product order: last LM fastest
        p = self.p

        def column(i: int, values: Sequence[float]) -> npt.NDArray[np.float64]:
            return np.array(values, np.float64)[picks[i]]

        zero = np.zeros(size)
        cores, memory, vram = zero.copy(), zero.copy(), zero.copy()
        n_gpu = np.zeros(size, np.int64)
        for i, options in enumerate(choices):
            cores = cores + column(i, [o.cores for o in options])
            memory = memory + column(i, [o.memory for o in options])
            vram = vram + column(i, [o.vram if o.mode == "gpu" else 0.0 for o in options])
            n_gpu = n_gpu + np.array([o.vgpus for o in options], np.int64)[picks[i]]
        ok = (
            (cores <= self.cap_cores + 1e-9)
            & (memory <= self.cap_mem + 1e-9)
            & (n_gpu <= self.cap_vgpus)
            & (vram <= self.cap_vram + 1e-9)
        )
        if self.observed is not None:
            eta_gpu: Any = self.observed[0]
            f_gpu: Any = contention(eta_gpu, self.gamma_gpu)
            f_cpu: Any = contention(self.observed[1], p.cpu_contention) * contention(
                self.observed[2], p.cpu_contention
            )
        else:
            eta_gpu = n_gpu / self.cap_vgpus if self.cap_vgpus else zero
            f_gpu = 1.0 / (1.0 + self.gamma_gpu * eta_gpu)
            eta_cpu, eta_mem = cores / self.cap_cores, memory / self.cap_mem
            f_cpu = (1.0 / (1.0 + p.cpu_contention * eta_cpu)) * (
                1.0 / (1.0 + p.cpu_contention * eta_mem)
            )
        reward, churn = zero.copy(), zero.copy()
        for i, options in enumerate(choices):
            q = self.queue[i]
            gpu = column(
                i,
                [
                    q * self.alpha_gpu[i] * (o.vgpus**p.vgpu_speedup) if o.mode == "gpu" else 0.0
                    for o in options
                ],
            )
            cpu = column(i, [1.0 if o.mode == "cpu" else 0.0 for o in options])
            # (q alpha v^beta) f_gpu, or q alpha_cpu f_cpu, as `score` groups them
            reward = reward + np.where(cpu > 0, q * self.alpha_cpu[i] * f_cpu, gpu * f_gpu)
            changed = 1.0 + p.kappa * q
            churn = churn + column(
                i, [changed if o.active != self.was_active[i] else 0.0 for o in options]
            )
        price = p.p0 + p.p1 * eta_gpu + p.p2 * eta_gpu * eta_gpu
        scores = reward - p.v * (price * n_gpu + p.lambda_churn * churn)
        scores = np.where(ok, scores, -np.inf)
        # the scan's rule: an action replaces the best so far only if better by > 1e-12
        best_at, start = -1, 0
        while True:
            better = np.flatnonzero(scores[start:] > best_score + 1e-12)
            if not len(better):
                break
            best_at = start + int(better[0])
            best_score, start = float(scores[best_at]), best_at + 1
        if best_at < 0:
            return off
        return tuple(options[int(picks[i][best_at])] for i, options in enumerate(choices))

    def exhaustive_scan(self, choices: Sequence[Sequence[_Option]]) -> tuple[_Option, ...]:
        """`exhaustive` as a scalar scan over `itertools.product` (the reference)."""
        best: tuple[_Option, ...] = tuple(_OFF for _ in choices)
        best_score = self.score(best)
        for action in itertools.product(*choices):
            if self.feasible(action):
                s = self.score(action)
                if s > best_score + 1e-12:
                    best, best_score = action, s
        return best

    def local_search(self, choices: Sequence[Sequence[_Option]]) -> tuple[_Option, ...]:
        """Best-improvement single-LM moves from the all-off action until none improves.

        Used when the action space is too large to enumerate (many LMs with
        backlog); it finds a 1-move local optimum, which for the separable part
        of the score (backlog reward and churn) is the greedy knapsack order.
        """
        current = [_OFF for _ in choices]
        current_score = self.score(current)
        for _ in range(4 * len(choices) + 1):
            move: tuple[int, _Option] | None = None
            move_score = current_score
            for i, options in enumerate(choices):
                keep = current[i]
                for o in options:
                    if o == keep:
                        continue
                    current[i] = o
                    if self.feasible(current):
                        s = self.score(current)
                        if s > move_score + 1e-12:
                            move, move_score = (i, o), s
                current[i] = keep
            if move is None:
                break
            current[move[0]] = move[1]
            current_score = move_score
        return tuple(current)


def _lm(name: str, o: _Option) -> LMPlacement:
    return LMPlacement(lm=name, mode=o.mode, cpu_cores=o.cores, vgpus=o.vgpus)


def build(context: ClusterContext, seed: int, params: Mapping[str, Any]) -> LyapunovDeployer:
    """Factory: validated parameters -> deployer. `context` and `seed` are unused (pure, exact)."""
    del context, seed
    return LyapunovDeployer(parse_params(LyapunovParams, params, NAME))
