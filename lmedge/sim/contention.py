"""How fast each busy pod on a node serves while it shares the node.

GPU time-slicing by vGPU slots (or max-min fair by `emulation.gpuDemand`),
and the f(eta) slowdown of CPU, memory and GPU utilization, as the table in
`README.md` states them. Pure: it reads a node's pods and returns speeds; it
schedules nothing. Advancing each pod's progress and rescheduling its
completion at the new speed is the engine's (`Emulator._rebalance`).
"""

from __future__ import annotations

from lmedge.sim.entities import Instance, NodeSim
from lmedge.sim.scenario import EmulationSpec
from lmedge.sim.servicemodel import demand_rates, gpu_rate, slowdown


def busy_rates(node: NodeSim, em: EmulationSpec) -> list[tuple[Instance, float]]:
    """Each busy pod of `node` with its speed (work seconds per second, 1 = uncontended).

    Also sets the node's busy GPU slots and pods and its CPU level (the
    utilization integrals read them), so call it whenever the busy set changes.
    """
    busy = [i for i in node.instances.values() if i.busy]
    n_gpu = len(node.busy_slots)
    busy_slots = [0] * n_gpu
    busy_pods = [0] * n_gpu
    cpu_cores = 0.0
    cpu_level = 0.0
    for i in busy:
        if i.mode == "gpu":
            for g, s in i.binding:
                busy_slots[g] += s
                busy_pods[g] += 1
            cpu_level += em.gpu_host_cores
        else:
            cpu_cores += i.cores
            cpu_level += i.cores
    node.busy_slots, node.busy_pods = busy_slots, busy_pods
    node.cpu_level = min(cpu_level, node.spec.cpu_cores)
    f_cpu = slowdown(em.cpu_slowdown, cpu_cores / node.spec.cpu_cores) * slowdown(
        em.memory_slowdown, node.memory_used / node.spec.memory_gib
    )
    demand = _demand_rates(busy, n_gpu, em) if em.gpu_demand else None
    out: list[tuple[Instance, float]] = []
    for i in busy:
        if i.mode != "gpu":
            rate = f_cpu
        elif demand is None:
            rate = gpu_rate(
                i.binding, busy_slots, busy_pods, node.spec.vgpus_per_gpu, em.gpu_slowdown
            )
        else:
            rate = _split_rate(i, demand, busy_slots, busy_pods, node, em)
        out.append((i, rate))
    return out


def _demand_rates(
    busy: list[Instance], n_gpu: int, em: EmulationSpec
) -> dict[tuple[int, int], float]:
    """Speed factor of each busy GPU pod on each of its GPUs, keyed (id(pod), gpu)."""
    members: list[list[tuple[Instance, int]]] = [[] for _ in range(n_gpu)]
    for i in busy:
        if i.mode == "gpu":
            for g, s in i.binding:
                members[g].append((i, s))
    out: dict[tuple[int, int], float] = {}
    demand = em.gpu_demand
    for g, pods in enumerate(members):
        rates = demand_rates([s for _, s in pods], [demand.get(i.lm, 1.0) for i, _ in pods])
        for (i, _), r in zip(pods, rates, strict=True):
            out[(id(i), g)] = r
    return out


def _split_rate(
    i: Instance,
    demand: dict[tuple[int, int], float],
    busy_slots: list[int],
    busy_pods: list[int],
    node: NodeSim,
    em: EmulationSpec,
) -> float:
    inv = 0.0
    eta = 0.0
    for g, s in i.binding:
        inv += (s / i.vgpus) / demand[(id(i), g)]
        if busy_pods[g] >= 2:
            eta = max(eta, busy_slots[g] / node.spec.vgpus_per_gpu)
    return slowdown(em.gpu_slowdown, eta) / inv
