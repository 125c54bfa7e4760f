"""Which modes an LM can run in on a node: the one rule every layer asks.

A mode is open to an LM on a node when one pod of the LM, alone on the empty
node, would be started and served by the emulator (and admitted by the
Kubernetes scheduler): the node is a worker, the pod's deployment memory fits,
it can be given at least the LM's `minCpuCores`, and then

- gpu: the node has a GPU whose vRAM holds the LM's `minVramGib`;
- cpu: the LM runs on CPU (`cpu-or-gpu`) and has a CPU profile
  (`cpuSecondsPerPrompt`): without one there is no service time to serve it
  at, so no layer may choose CPU for it.

Every requirement of a mode is one clause of `_unmet`: `modes` lists the
modes that meet them all, `refusal` says which one a mode misses, and
`ClusterContext.modes` keeps `modes` per (node, LM).
A token engine (`lmedge.api.engines`) adds its own clauses: a throughput
profile for the node's hardware (a requirement of the mode), and its weights
plus KV cache within the node's vRAM or memory (a requirement of room). A new
requirement is one more clause here, and every policy, the decision guard,
the agents' prompts and the emulator follow it.

What this does *not* decide: whether several pods fit together (the sums of
`check_placement`, the emulator's `_misfit` against what already runs), or
which mode a policy prefers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lmedge.api.decisions import Mode
from lmedge.api.engines import fits, throughput_profile
from lmedge.api.resources import EdgeNodeSpec, LMServiceSpec

if TYPE_CHECKING:
    from lmedge.api.observations import NodeInfo, ServiceInfo

#: The modes a pod can run in, in the order `modes` breaks a tie of speed.
RUNNING_MODES: tuple[Mode, ...] = ("gpu", "cpu")


def modes(node: EdgeNodeSpec, lm: LMServiceSpec) -> tuple[Mode, ...]:
    """The modes `lm` can run in on `node` (never "off"), fastest first; () when none.

    Fastest by the profile: `gpuSecondsPerPrompt` against `cpuSecondsPerPrompt`
    on the LM's default cores, GPU first on a tie. Prefer
    `ClusterContext.modes`, which keeps the answer per (node, LM).
    """
    open_ = [m for m in RUNNING_MODES if not _unmet(node, lm, m, room=True)]
    return tuple(sorted(open_, key=lambda m: _seconds_per_prompt(lm, m)))


def refusal(node: NodeInfo, lm: ServiceInfo, mode: Mode, *, room: bool = True) -> str:
    """Why one pod of `lm` cannot run in `mode` alone on `node`, as a sentence; "" when it can.

    The first unmet requirement of `modes` only; "off" is always open.
    `room=False` leaves out the clauses of room (memory, cores, vRAM), for a
    caller that checks room itself against what else runs there
    (`check_placement`'s sums, the emulator's `_misfit`): a pod alone on the
    empty node passes those exactly when it passes these.
    """
    return _unmet(node.spec, lm.spec, mode, room=room).format(node=node.name, lm=lm.name)


def _unmet(n: EdgeNodeSpec, s: LMServiceSpec, mode: Mode, *, room: bool) -> str:
    """The first unmet requirement, a sentence with {node} and {lm} to fill; "" when none."""
    if mode == "off":
        return ""
    if n.role != "worker":
        return "{node} is a control node and hosts no LMs"
    if mode == "gpu" and not n.has_gpu:
        return "{node} has no GPU; {lm} cannot run in gpu mode"
    if mode == "cpu" and s.runs_on == "gpu-only":
        return "{lm} runs on GPU only; mode cpu is not allowed"
    if mode == "cpu" and s.profile.cpu_seconds_per_prompt is None:
        return "{lm} has no CPU profile (cpuSecondsPerPrompt); mode cpu is not allowed"
    if s.engine.tokens is not None and throughput_profile(s, n, mode) is None:
        return _engine_refusal(mode, fits(s, n, mode) or "")
    if not room:
        return ""
    if s.deployment_memory_gib > n.memory_gib:
        return f"{{lm}} needs {s.deployment_memory_gib:g} GiB memory; {{node}} has {n.memory_gib:g}"
    if s.min_cpu_cores > n.cpu_cores:
        return (
            f"{{lm}} needs at least {s.min_cpu_cores:g} CPU cores (minCpuCores); "
            f"{{node}} has {n.cpu_cores:g}"
        )
    if mode == "gpu" and s.min_vram_gib > n.total_vram_gib:
        return (
            f"{{lm}} needs {s.min_vram_gib:g} GiB vRAM in gpu mode; "
            f"{{node}} has {n.total_vram_gib:g}"
        )
    if why := fits(s, n, mode):
        return _engine_refusal(mode, why)
    return ""


def _engine_refusal(mode: Mode, why: str) -> str:
    """A token engine's own reason (`engines.fits`) as a sentence to fill with {node}, {lm}."""
    literal = why.replace("{", "{{").replace("}", "}}")
    return f"{{lm}} cannot run in {mode} mode on {{node}}: {literal}"


def _seconds_per_prompt(s: LMServiceSpec, mode: Mode) -> float:
    cpu_s = s.profile.cpu_seconds_per_prompt
    if mode == "cpu" and cpu_s is not None:
        return cpu_s
    return s.profile.gpu_seconds_per_prompt
