"""How fast an LM serves on a node: the rule backends' (and the prompts') cost model.

The rules cannot see the emulator's physics (the same plugins run on a real
cluster), so they use the profiled service times of each `LMService` and two
documented assumptions:

- GPU: busy pods time-slice a physical GPU, so a pod holding `v` of the GPU's
  `vgpus_per_gpu` slots gets about `v / vgpus_per_gpu` of it under load:
  rate = min(v / vgpus_per_gpu, gpus) / gpuSecondsPerPrompt prompts/s.
- CPU: Amdahl scaling with parallel fraction `p` (default 0.8):
  S(c) = 1 / ((1 - p) + p / c), and cpuSecondsPerPrompt is measured at the
  default cores, so rate(c) = S(c) / S(default) / cpuSecondsPerPrompt.

Only relative rates matter to the rules (weights, ranking), so a wrong
absolute speed shifts every option alike.
"""

from __future__ import annotations

from lmedge.api import EdgeNodeSpec, InstanceState, LMServiceSpec

#: Amdahl parallel fraction assumed for CPU inference (emulator default: 0.8).
CPU_PARALLEL_FRACTION = 0.8
#: Expected pod start + model load, seconds (paper §V-D: median 9.34 s).
COLD_START_S = 9.34


def cpu_speedup(cores: float, p: float = CPU_PARALLEL_FRACTION) -> float:
    """Amdahl speedup S(c) of `cores` over one core."""
    if cores <= 0:
        return 0.0
    return 1.0 / ((1.0 - p) + p / cores)


def cpu_rate(svc: LMServiceSpec, cores: float) -> float:
    """Prompts per second of one CPU-mode pod with `cores` cores (0 if CPU is not allowed)."""
    cpu_s = svc.profile.cpu_seconds_per_prompt
    if svc.runs_on != "cpu-or-gpu" or cpu_s is None or cores <= 0:
        return 0.0
    return cpu_speedup(cores) / cpu_speedup(svc.default_cpu_cores) / cpu_s


def gpu_rate(svc: LMServiceSpec, node: EdgeNodeSpec, vgpus: int) -> float:
    """Prompts per second of one GPU-mode pod holding `vgpus` slots, GPUs shared under load."""
    if not node.has_gpu or vgpus <= 0:
        return 0.0
    share = min(vgpus / node.vgpus_per_gpu, float(len(node.gpus)))
    return share / svc.profile.gpu_seconds_per_prompt


def instance_rate(svc: LMServiceSpec, node: EdgeNodeSpec, inst: InstanceState) -> float:
    """Prompts per second of a running (or starting) instance."""
    if inst.mode == "gpu":
        return gpu_rate(svc, node, inst.vgpus)
    return cpu_rate(svc, inst.cpu_cores)


def best_rate(svc: LMServiceSpec, node: EdgeNodeSpec) -> float:
    """Rate of a typical new instance: one vGPU on a GPU node, else the default cores."""
    if node.has_gpu and svc.min_vram_gib <= node.total_vram_gib:
        return gpu_rate(svc, node, 1)
    return cpu_rate(svc, svc.default_cpu_cores)
