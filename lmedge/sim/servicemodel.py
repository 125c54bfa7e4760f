"""How fast a model instance serves, given its resources and its neighbours.

Service time of one prompt = base time / rate, where the *base time* comes
from the LMService profile and the instance's own resources, and the *rate*
(<= 1) from what else is busy on the node at the same moment.

- GPU mode: base = `gpuSecondsPerPrompt` (one uncontended instance; DESIGN.md
  reads it as 30 / alpha_gpu). Time-slicing is work-conserving and weighted by
  vGPU slots: on a physical GPU g whose busy pods hold B_g slots, a busy pod
  holding s_g of them gets the share s_g / B_g. A pod spread over several
  GPUs by `device_map` runs its layers on them in turn (model parallel, not
  data parallel), so its time per prompt is the slot-weighted sum over its
  GPUs: 1 / rate = sum_g (s_g / v) / (s_g / B_g) = sum_g B_g / v, v = the
  pod's slots. Alone, a pod therefore runs at rate 1 whatever its vGPU count:
  more vGPUs buy a larger share under contention, never a speedup.
  Context-switch overhead: f(eta_gpu) with eta_gpu = B_g / slots of g when two
  or more pods are busy on g, else 0. A GPU pod's CPU cores do not change its
  speed (assumption: host-side work is not the bottleneck).
- CPU mode: base = `cpuSecondsPerPrompt` * S(defaultCpuCores) / S(c) with
  Amdahl's S(c) = 1 / ((1 - p) + p / c); rate = f(eta_cpu) * f(eta_mem) as in
  the paper's Eq. 13.

Optional GPU demands (`emulation.gpuDemand`, default 1 for every LM):
a pod that leaves the GPU partly idle when alone contends only when the
demands on a GPU add up to more than 1 (`demand_rates`); a pod spread over
several GPUs is then charged its demand on each of them (conservative).

f(eta) = 1 / (1 + beta * max(0, eta - eta0)) (see `SlowdownSpec`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from lmedge.sim.scenario import SlowdownSpec


def slowdown(spec: SlowdownSpec, eta: float) -> float:
    """f(eta): 1 below the knee, then 1 / (1 + beta (eta - eta0))."""
    over = eta - spec.eta0
    return 1.0 if over <= 0 else 1.0 / (1.0 + spec.beta * over)


def amdahl(cores: float, parallel_fraction: float) -> float:
    """Speedup of `cores` cores over one core."""
    return 1.0 / ((1.0 - parallel_fraction) + parallel_fraction / max(cores, 1e-9))


def cpu_base_seconds(
    seconds_at_default: float, default_cores: float, cores: float, parallel_fraction: float
) -> float:
    """Seconds per prompt on `cores` cores, given the profiled time on the default cores."""
    return (
        seconds_at_default
        * amdahl(default_cores, parallel_fraction)
        / amdahl(cores, parallel_fraction)
    )


def gpu_rate(
    binding: Sequence[tuple[int, int]],
    busy_slots: Sequence[int],
    busy_pods: Sequence[int],
    slots_per_gpu: int,
    spec: SlowdownSpec,
) -> float:
    """Rate of a busy GPU pod bound as [(gpu, slots), ...] (itself counted in busy_*)."""
    v = sum(s for _, s in binding)
    inv = 0.0
    eta = 0.0
    for g, _ in binding:
        inv += busy_slots[g] / v
        if busy_pods[g] >= 2:
            eta = max(eta, busy_slots[g] / slots_per_gpu)
    return slowdown(spec, eta) / inv


def demand_rates(weights: Sequence[float], demands: Sequence[float]) -> list[float]:
    """Speed factors (<= 1) of the busy pods on one GPU, given their GPU demands.

    A pod with demand d uses the fraction d of the GPU's time when it runs
    alone at full speed (small text models leave the GPU mostly idle). The
    GPU's time is shared by weighted max-min fairness (weights = vGPU slots):
    pods demanding less than their fair share get all they ask for, the rest
    split what remains by weight. Speed = share / demand. With every demand
    1 this is the plain slot-weighted share s / B.
    """
    n = len(weights)
    share = [0.0] * n
    open_ = list(range(n))
    left = 1.0
    while open_:
        fair = left / sum(weights[i] for i in open_)
        capped = [i for i in open_ if demands[i] <= fair * weights[i]]
        if not capped:
            for i in open_:
                share[i] = fair * weights[i]
            break
        for i in capped:
            share[i] = demands[i]
            left -= demands[i]
        open_ = [i for i in open_ if i not in capped]
    return [min(1.0, share[i] / demands[i]) for i in range(n)]


def lognormal_unit(cv: float) -> tuple[float, float]:
    """(mu, sigma) of a lognormal with mean 1 and coefficient of variation `cv`."""
    sigma2 = math.log1p(cv * cv)
    return -sigma2 / 2.0, math.sqrt(sigma2)
