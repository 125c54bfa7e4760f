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

from lmedge.api import EdgeNodeSpec, InstanceState, LMServiceSpec, hosting

#: Amdahl parallel fraction assumed for CPU inference (emulator default: 0.8).
CPU_PARALLEL_FRACTION = 0.8
#: CPU cores given to a GPU-mode pod: host code and tokenizer only; the rest of
#: the node's cores are worth more to CPU-mode text LMs.
GPU_POD_CORES = 2.0
#: A text LM "prefers CPU" when its CPU time per prompt is within this factor of
#: its GPU time: it then runs on cores nobody else can use and leaves the vGPUs
#: to the rest. On the recalibrated testbed no LM does (LM1: 8.15 / 0.6 = 13.6,
#: LM2: 30 / 1.2 = 25), so both text LMs plan for GPUs and fall back to cores
#: when no vGPU is left. (Measured, seeds 2 and 11: LM1 on cores frees GPU time
#: for LM4 -- Jain 0.961/0.969 -> 0.974/0.976, J 0.040/0.036 -> 0.036/0.035 --
#: at 31-34 s instead of 4-6 s LM1 latency; a load-aware choice is future work.)
CPU_PREFERENCE = 2.0


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
    """Rate of a typical new instance in its planned mode: one vGPU, or half the node's cores."""
    mode = planned_mode(svc, node)
    if mode == "gpu":
        return gpu_rate(svc, node, 1)
    if mode == "cpu":
        return cpu_rate(svc, max(svc.default_cpu_cores, node.cpu_cores / 2))
    return 0.0


def prefers_cpu(svc: LMServiceSpec) -> bool:
    """Whether the rules run this LM on CPU by choice (see `CPU_PREFERENCE`)."""
    cpu_s = svc.profile.cpu_seconds_per_prompt
    return (
        svc.runs_on == "cpu-or-gpu"
        and cpu_s is not None
        and cpu_s <= CPU_PREFERENCE * svc.profile.gpu_seconds_per_prompt
    )


def planned_mode(svc: LMServiceSpec, node: EdgeNodeSpec) -> str:
    """The mode the rules give this LM on this node: "gpu", "cpu" or "" (cannot run).

    Among the modes `lmedge.api.hosting.modes` opens: GPU unless the LM prefers CPU.
    """
    open_ = hosting.modes(node, svc)
    gpu_ok, cpu_ok = "gpu" in open_, "cpu" in open_
    if gpu_ok and not (cpu_ok and prefers_cpu(svc)):
        return "gpu"
    return "cpu" if cpu_ok else ""
