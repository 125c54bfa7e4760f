"""Observations rendered as the short sentences the agents read (paper §V-D2).

Only system telemetry goes in: capacities, footprints, backlogs, activations,
headroom, aggregate metrics and policies. The observation models carry no
request content at all, so no user prompt text can reach an LLM through here
(tests/integration/test_privacy.py checks the wire).

Size: the planner prompt grows with nodes x LMs (it describes the cluster and
a policy over it); the scheduler prompt grows with the pairs it must route
plus a fixed top-k candidate list per LM, never with every node; a deployer
prompt describes its own node only.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from string import Template

from lmedge.agents.memory import SelectedCase
from lmedge.agents.rules.scheduler import ADMIT_FRACTION, Candidate
from lmedge.api import (
    Arrival,
    ClusterContext,
    EpochMetrics,
    MacroPolicy,
    NodeInfo,
    NodeObservation,
    Placement,
    PlanningObservation,
    RoutingMap,
    ServiceInfo,
)

#: Candidate destinations shown per LM to the scheduler.
TOP_K = 4


@cache
def template(name: str) -> Template:
    """A system prompt template from `lmedge/agents/prompts/<name>.txt`."""
    text = resources.files("lmedge.agents").joinpath("prompts", f"{name}.txt").read_text()
    return Template(text.strip())


def _f(x: float | None, digits: int = 1) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def _gib(x: float) -> str:
    return f"{x:g} GiB"


def describe_node(n: NodeInfo) -> str:
    s = n.spec
    if s.role != "worker":
        return f"{n.name}: control node, hosts no LMs."
    gpu = (
        f"{len(s.gpus)} GPU(s) with {_gib(s.total_vram_gib)} vRAM in {s.total_vgpus} vGPUs"
        if s.has_gpu
        else "no GPU"
    )
    return f"{n.name} ({s.site}): {s.cpu_cores:g} cores, {_gib(s.memory_gib)} memory, {gpu}."


def describe_service(sv: ServiceInfo) -> str:
    s = sv.spec
    where = "GPU only" if s.runs_on == "gpu-only" else "GPU or CPU"
    speed = f"{s.profile.gpu_seconds_per_prompt:.1f} s/prompt on a vGPU"
    if s.profile.cpu_seconds_per_prompt is not None:
        speed += f", {s.profile.cpu_seconds_per_prompt:.1f} s on {s.default_cpu_cores:g} cores"
    return (
        f"{sv.name} ({s.modality}): {where}; needs {_gib(s.deployment_memory_gib)} memory"
        f" and {_gib(s.min_vram_gib)} vRAM on GPU; {speed}; at most {s.max_vgpus} vGPUs."
    )


def describe_cluster(ctx: ClusterContext) -> str:
    """Servers (identical ones on one line, so the text grows by a name per node) and LMs."""
    groups: dict[str, list[str]] = {}
    for n in ctx.nodes:
        text = describe_node(n)
        groups.setdefault(text[len(n.name) :], []).append(n.name)
    lines = ["Servers:"]
    lines += [f"- {', '.join(names)}{rest}" for rest, names in groups.items()]
    lines.append("LMs:")
    lines += [f"- {describe_service(s)}" for s in ctx.services]
    return "\n".join(lines)


def describe_metrics(m: EpochMetrics, when: str) -> str:
    lms = [s for s in m.per_lm]
    names = "/".join(s.lm for s in lms)
    lat = ", ".join(_f(s.mean_latency_s) for s in lms)
    rho = ", ".join(_f(s.success_ratio, 2) for s in lms)
    return (
        f"{when}, {names} have success-only mean latencies {lat} s with success ratios {rho},"
        f" respectively ({m.successes}/{m.requests} requests served"
        + (f", {m.rejected} refused at once by admission control" if m.rejected else "")
        + "). The global mean latency"
        f" is {_f(m.mean_latency_s)} s, the normalized Jain fairness over success ratios is"
        f" {_f(m.f_norm, 2)} and the objective is {_f(m.objective, 3)} (lower is better);"
        f" the router's off-role ratio was {m.off_role_ratio * 100:.1f}%."
    )


def describe_policy(p: MacroPolicy) -> str:
    parts = []
    for r in p.routing:
        ws = ", ".join(
            f"{w.node} {w.p:.2f}" for w in sorted(r.weights, key=lambda w: -w.p) if w.p > 0
        )
        parts.append(f"{r.lm} -> {ws}")
    roles = "; ".join(f"{r.node} {{{', '.join(r.lms)}}}" for r in p.roles)
    return "Routing: " + "; ".join(parts) + f". Roles: {roles}."


def compact_json(value: MacroPolicy | Placement | RoutingMap) -> str:
    return json.dumps(value.model_dump(mode="json"), separators=(",", ":"))


def render_planning(
    obs: PlanningObservation, cases: list[SelectedCase], reference: MacroPolicy
) -> tuple[str, str]:
    """(system, user) prompts for the planner."""
    ctx = obs.context
    system = template("planner").substitute(
        epoch_slots=ctx.epoch_slots, slot_s=f"{ctx.slot_s:g}", tau_s=f"{ctx.tau_s:g}", lam=ctx.lam
    )
    lines = [f"Epoch {obs.epoch}.", describe_cluster(ctx)]
    if obs.traffic:
        mix = ", ".join(f"{lm} {n}" for lm, n in sorted(obs.traffic.items()))
        lines.append(f"Prompts per LM in the last epoch: {mix}.")
    if obs.baseline is not None:
        lines.append(describe_metrics(obs.baseline, "Under the random baseline policy"))
    if obs.last is not None:
        lines.append(describe_metrics(obs.last, "In the last epoch"))
    if obs.previous is not None:
        lines.append("Previous macro policy. " + describe_policy(obs.previous))
    for sc in cases:
        c = sc.case
        mix = ", ".join(f"{lm} {n}" for lm, n in sorted(c.traffic.items()))
        lines.append(
            f"Past case ({sc.label}), epoch {c.epoch}, traffic {mix}, objective"
            f" {_f(c.objective, 3)}: {describe_policy(c.policy)} "
            + describe_metrics(c.metrics, "There")
        )
    lines.append(
        "Reference policy from a capacity-proportional heuristic (improve on it if the"
        f" evidence says so): {compact_json(reference)}"
    )
    return system, "\n".join(lines)


def render_slot(
    ctx: ClusterContext,
    slot: int,
    epoch: int,
    macro: MacroPolicy | None,
    ranked: dict[str, list[Candidate]],
    arrivals: list[Arrival],
    reference: RoutingMap,
    admit_fraction: float | None = ADMIT_FRACTION,
) -> tuple[str, str]:
    """(system, user) prompts for the scheduler: top-k candidates per LM, then the pairs."""
    if admit_fraction is None:
        admission = (
            "Admission control is off: route every listed pair and leave `rejections` empty."
        )
    else:
        admission = (
            "Admission control is on: when even the best candidate would finish a set later"
            f" than {admit_fraction * ctx.tau_s:g} s (est), you may list its pair in"
            " `rejections` instead of routing it; its requests are then refused at once"
            " (they count as failures, so reject only what cannot be served in time, and"
            " it keeps the queues short for the others)."
        )
    system = template("scheduler").substitute(
        slot_s=f"{ctx.slot_s:g}", tau_s=f"{ctx.tau_s:g}", admission=admission
    )
    lines = [f"Epoch {epoch}, slot {slot}."]
    if macro is None:
        lines.append("No macro policy yet: use any candidate.")
    lines.append(
        "Candidates per LM, best first (status: ready/pending running, role = will be"
        " started, draining = still running but no longer planned here (avoid), off = not"
        " planned here; q = queued prompts; p = planner weight;"
        " est = estimated completion of these prompts):"
    )
    for lm, cands in ranked.items():
        shown = "; ".join(
            f"{c.node} {c.status} q={c.backlog} p={c.p:.2f} est={c.cost_s:.0f}s"
            for c in cands[:TOP_K]
        )
        lines.append(f"- {lm}: {shown}")
    prompts = {(a.origin, a.lm): a.prompts for a in arrivals}
    suggested = [(r.origin, r.lm, r.destination) for r in reference.routes]
    suggested += [(r.origin, r.lm, "reject") for r in reference.rejections]
    pairs = ", ".join(
        f"{o}/{lm}({prompts.get((o, lm), 0)})->{dest}" for o, lm, dest in sorted(suggested)
    )
    lines.append(f"Pairs to route, origin/lm(prompts)->suggested destination (or reject): {pairs}")
    return system, "\n".join(lines)


def hardware_profile(node: NodeInfo) -> tuple[str, str]:
    """(hardware sentence, allowed modes sentence) for a node's system prompt."""
    s = node.spec
    if not s.has_gpu:
        return (
            f"a CPU-only server with {s.cpu_cores:g} cores and {_gib(s.memory_gib)} memory.",
            "There is no GPU: GPU-only LMs must be off, the others run in cpu mode.",
        )
    kind = "single-GPU" if len(s.gpus) == 1 else f"{len(s.gpus)}-GPU"
    return (
        f"a {kind} server with {s.cpu_cores:g} cores, {_gib(s.memory_gib)} memory and"
        f" {s.total_vgpus} time-sliced vGPUs ({_gib(s.total_vram_gib)} vRAM).",
        "GPU-only LMs run in gpu mode; text LMs may use gpu or cpu mode (CPU is slower"
        " but uses spare cores).",
    )


def render_node(obs: NodeObservation, reference: Placement) -> tuple[str, str]:
    """(system, user) prompts for one node's deployer."""
    hw, modes = hardware_profile(obs.node)
    system = template("deployer").substitute(
        node=obs.node.name,
        hardware=hw,
        modes=modes,
        slot_s=f"{obs.slot_s:g}",
        tau_s=f"{obs.tau_s:g}",
    )
    st = obs.state
    roles = ", ".join(obs.roles) or "none"
    lines = [
        f"Slot {obs.slot}. Your role: {roles}.",
        f"Free now: {st.free_cpu_cores:g} cores, {_gib(st.free_memory_gib)} memory,"
        f" {st.free_vgpus} vGPUs, {_gib(st.free_vram_gib)} vRAM; GPU utilisation"
        f" {st.gpu_util:.0%}, CPU {st.cpu_util:.0%}."
        + (" A pod is still starting: adding resources now is voided." if st.pending else ""),
    ]
    for sv in obs.services:
        inst = st.instance(sv.name)
        run = (
            f"running {inst.mode} with {inst.cpu_cores:g} cores and {inst.vgpus} vGPUs"
            f" ({inst.status})"
            if inst
            else "off"
        )
        lines.append(
            f"- {sv.name}: {st.backlog.get(sv.name, 0)} queued prompts, {run}. "
            + describe_service(sv)
        )
    lines.append(f"Reference placement from a heuristic: {compact_json(reference)}")
    return system, "\n".join(lines)
