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
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from importlib import resources
from string import Template
from typing import Any

from lmedge.agents.llm import ReplyFormat
from lmedge.agents.memory import SelectedCase
from lmedge.agents.rules.deployer import gpu_pod_cores
from lmedge.agents.rules.scheduler import ADMIT_FRACTION, Candidate, admission_horizon_s
from lmedge.api import (
    Arrival,
    ClusterContext,
    EpochMetrics,
    LMPlacement,
    LMRouting,
    MacroPolicy,
    NodeInfo,
    NodeObservation,
    NodeRole,
    NodeState,
    Placement,
    PlanningObservation,
    Rejection,
    Route,
    RouteWeight,
    RoutingMap,
    ServiceInfo,
    hosting,
)

#: Candidate destinations shown per LM to the scheduler.
TOP_K = 4


@dataclass(frozen=True)
class SlotView:
    """What the scheduler's prompts and reply formats read about one slot.

    Built once per decision and passed to the flat and the hierarchical
    renderers and reply formats alike, so both forms describe the same slot.
    """

    ctx: ClusterContext
    slot: int
    epoch: int
    macro: MacroPolicy | None
    states: dict[str, NodeState]
    arrivals: list[Arrival]
    #: The rule's map for the slot: its suggestions and refusals.
    reference: RoutingMap
    #: Per LM to route, its candidates best first (`rules.scheduler.candidates`).
    ranked: dict[str, list[Candidate]]
    #: The router's admission horizon as a fraction of a deadline; None: off.
    admit_fraction: float | None = ADMIT_FRACTION

    @property
    def admission(self) -> bool:
        return self.admit_fraction is not None


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


#: The flat planner's output instruction: per-node weights and roles.
PLANNER_FLAT_OUTPUT = (
    'Output one JSON object {"routing": {"<lm>": {"<node>": weight, ...}, ...}, "roles":'
    ' {"<worker>": ["<lm>", ...], ...}}: for every LM a weight for each node that can host it'
    " (relative shares of the LM's traffic, 0 for none; normalised to sum to 1 for you), and"
    " for every worker the LMs it is expected to host (the set must fit the node at once:"
    " memory; one vGPU per GPU-only LM). The shape, for another network:"
    ' {"routing": {"a": {"n1": 3, "n2": 1}}, "roles": {"n1": ["a"], "n2": ["a"]}}'
)


def planner_system(ctx: ClusterContext, output: str) -> str:
    """The planner's system prompt with the output instruction of its prompt form."""
    return template("planner").substitute(
        epoch_slots=ctx.loop.epoch_slots,
        slot_s=f"{ctx.loop.slot_s:g}",
        tau_s=f"{ctx.loop.tau_s:g}",
        lam=ctx.loop.lam,
        output=output,
    )


def scheduler_system(ctx: ClusterContext, admit_fraction: float | None, output: str) -> str:
    """The scheduler's system prompt (admission sentence, output instruction of its form)."""
    if admit_fraction is None:
        admission = "Admission control is off: serve every listed pair."
    else:
        # per LM, as the rule refuses (an LMService may have its own deadline)
        cutoffs = {lm: f"{admission_horizon_s(ctx, lm, admit_fraction):g} s" for lm in ctx.lm_names}
        if len(set(cutoffs.values())) == 1:
            cutoff = next(iter(cutoffs.values()))
        else:
            cutoff = (
                "its LM's cut-off (" + ", ".join(f"{lm} {c}" for lm, c in cutoffs.items()) + ")"
            )
        admission = (
            "Admission control is on: when even the best candidate would finish a set later"
            f" than {cutoff} (est), you may refuse its pair"
            " instead (its requests count as failures, so refuse only what cannot be served"
            " in time; it keeps the queues short for the others)."
        )
    return template("scheduler").substitute(
        slot_s=f"{ctx.loop.slot_s:g}",
        timeouts=timeouts({lm: ctx.deadline_s(lm) for lm in ctx.lm_names}),
        admission=admission,
        output=output,
    )


def timeouts(deadlines: dict[str, float]) -> str:
    """The sentence telling an agent when requests time out: one deadline, or each LM's."""
    values = {f"{d:g} s" for d in deadlines.values()}
    if len(values) <= 1:
        return f"Requests time out after {next(iter(values), '?')}."
    each = ", ".join(f"{lm} at {d:g} s" for lm, d in deadlines.items())
    return f"Requests time out at their LM's deadline: {each}."


def epoch_lines(obs: PlanningObservation) -> list[str]:
    """The last epoch's traffic and metrics, and the random baseline's, one line each."""
    lines = []
    if obs.traffic:
        mix = ", ".join(f"{lm} {n}" for lm, n in sorted(obs.traffic.items()))
        lines.append(f"Prompts per LM in the last epoch: {mix}.")
    if obs.baseline is not None:
        lines.append(describe_metrics(obs.baseline, "Under the random baseline policy"))
    if obs.last is not None:
        lines.append(describe_metrics(obs.last, "In the last epoch"))
    return lines


def render_planning(
    obs: PlanningObservation, cases: list[SelectedCase], reference: MacroPolicy
) -> tuple[str, str]:
    """(system, user) prompts for the planner."""
    ctx = obs.context
    system = planner_system(ctx, PLANNER_FLAT_OUTPUT)
    lines = [f"Epoch {obs.epoch}.", describe_cluster(ctx)]
    lines += epoch_lines(obs)
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


def engines_sentence(states: Iterable[NodeState]) -> str | None:
    """The token engines' KV cache and queues in one sentence; None when no node reports any.

    None keeps a prompt exactly as it is without token engines (pipeline LMs).
    """
    parts = [
        f"{st.name}/{e.lm} KV "
        + (f"{e.kv_cache_usage:.0%}" if e.kv_cache_usage is not None else "n/a")
        + f", {e.running} running, {e.waiting} waiting"
        for st in states
        for e in st.engines or ()
    ]
    if not parts:
        return None
    return "Token engines (node/LM: KV cache in use, sequences): " + "; ".join(parts) + "."


def render_slot(view: SlotView) -> tuple[str, str]:
    """(system, user) prompts for the scheduler: top-k candidates per LM, then the pairs."""
    output = (
        'Output one JSON object {"routes": {"<origin>/<lm>": "<destination>", ...}} with one'
        " entry for every listed pair and only destinations listed as candidates for its LM"
        + (f' (or "{REJECT}" to refuse the pair)' if view.admission else "")
        + '. The shape, for another network: {"routes": {"n1/a": "n2", "n3/a": "n3"}}'
    )
    system = scheduler_system(view.ctx, view.admit_fraction, output)
    lines = [f"Epoch {view.epoch}, slot {view.slot}."]
    if view.macro is None:
        lines.append("No macro policy yet: use any candidate.")
    lines.append(
        "Candidates per LM, best first (status: ready/pending running, role = will be"
        " started, draining = still running but no longer planned here (avoid), off = not"
        " planned here; q = queued prompts; p = planner weight;"
        " est = estimated completion of these prompts):"
    )
    for lm, cands in view.ranked.items():
        shown = "; ".join(
            f"{c.node} {c.status} q={c.backlog} p={c.p:.2f} est={c.cost_s:.0f}s"
            for c in cands[:TOP_K]
        )
        lines.append(f"- {lm}: {shown}")
    engines = engines_sentence(view.states.values())
    if engines:
        lines.append(engines)
    prompts = {(a.origin, a.lm): a.prompts for a in view.arrivals}
    pairs = ", ".join(
        f"{o}/{lm}({prompts.get((o, lm), 0)})->{dest}"
        for o, lm, dest in routing_pairs(view.reference)
    )
    lines.append(
        f"Pairs to route, origin/lm(prompts)->suggested destination (or {REJECT}): {pairs}"
    )
    return system, "\n".join(lines)


def hardware_profile(node: NodeInfo) -> str:
    """The hardware sentence of a node's system prompt."""
    s = node.spec
    if not s.has_gpu:
        return f"a CPU-only server with {s.cpu_cores:g} cores and {_gib(s.memory_gib)} memory."
    kind = "single-GPU" if len(s.gpus) == 1 else f"{len(s.gpus)}-GPU"
    return (
        f"a {kind} server with {s.cpu_cores:g} cores, {_gib(s.memory_gib)} memory and"
        f" {s.total_vgpus} time-sliced vGPUs ({_gib(s.total_vram_gib)} vRAM)."
    )


def modes_sentence(node: NodeInfo, services: list[ServiceInfo]) -> str:
    """What each LM may run in on `node`: the reply schema's mode enum (`allowed_modes`), said.

    One function gives both, so the prompt never allows a mode the schema
    refuses (or the reverse).
    """
    each = []
    for sv in services:
        open_ = [m for m in allowed_modes(sv, node) if m != "off"]
        each.append(f"{sv.name} {' or '.join(open_)}" if open_ else f"{sv.name} off only")
    return (
        "Modes each LM may take here besides off, fastest first: " + "; ".join(each) + "."
        " CPU is slower than GPU but uses spare cores."
    )


def render_node(obs: NodeObservation, reference: Placement) -> tuple[str, str]:
    """(system, user) prompts for one node's deployer."""
    system = template("deployer").substitute(
        node=obs.node.name,
        hardware=hardware_profile(obs.node),
        modes=modes_sentence(obs.node, obs.services),
        slot_s=f"{obs.slot_s:g}",
        timeouts=timeouts({sv.name: sv.spec.deadline_s or obs.tau_s for sv in obs.services}),
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
    engines = engines_sentence([st])
    if engines:
        lines.append(engines)
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


# ---------------------------------------------------------------------------
# Reply formats: what each agent asks the server to generate, and the
# deterministic side that turns the reply into the decision.
#
# The schemas are built per observation so a grammar-constrained server
# cannot generate an invalid name or count: every node and LM name is a key
# or an enum of the scenario's names (objects keyed by name have a fixed set
# of required keys, which every structured-output dialect enforces; arrays
# with `prefixItems` are not portable). Numbers a grammar cannot bound
# (weights, which it does not normalise) are checked or normalised here.
# Each parser also takes the full decision model (a list-shaped `lms`,
# `routes` or `routing`): what a server without structured output, or an
# older prompt, may send.

#: Destination of a refused pair in the compact routing reply. Upper case, so
#: it is never an RFC 1123 node name.
REJECT = "REJECT"
#: Reply-size bounds (`max_tokens`): a JSON key, a short value and the
#: punctuation are about 10-15 tokens; these leave room for whitespace.
TOKENS_PER_PLACEMENT_LM = 25
TOKENS_PER_ROUTE = 25
TOKENS_PER_WEIGHT = 10
TOKENS_BASE = 40


def _obj(props: dict[str, Any]) -> dict[str, Any]:
    """A closed JSON Schema object with every property required."""
    return {
        "type": "object",
        "properties": props,
        "required": list(props),
        "additionalProperties": False,
    }


def _dict_of(data: Any, key: str) -> dict[str, Any]:
    value = data.get(key) if isinstance(data, dict) else None
    if not isinstance(value, dict):
        raise ValueError(f"`{key}` must be an object keyed by name")
    return value


def _keys_problems(got: dict[str, Any], want: list[str], what: str) -> list[str]:
    problems = [f"{what} {k!r} is not one of {', '.join(want)}" for k in got if k not in want]
    problems += [f"{what} {k!r} is missing" for k in want if k not in got]
    return problems


def allowed_modes(sv: ServiceInfo, node: NodeInfo) -> list[str]:
    """Modes an LM can run in on a node (`lmedge.api.hosting.modes`), then `off`."""
    return [*hosting.modes(node.spec, sv.spec), "off"]


def placement_format(obs: NodeObservation) -> ReplyFormat[Placement]:
    """The deployer's reply: per LM a mode and, in gpu mode, vGPUs; cores are sized here."""
    props: dict[str, Any] = {}
    for sv in obs.services:
        modes = allowed_modes(sv, obs.node)
        top = min(sv.spec.max_vgpus, obs.node.spec.total_vgpus) if "gpu" in modes else 0
        props[sv.name] = _obj(
            {
                "mode": {"type": "string", "enum": modes},
                "vgpus": {"type": "integer", "enum": list(range(top + 1))},
            }
        )
    tokens = TOKENS_BASE + TOKENS_PER_PLACEMENT_LM * len(obs.services)
    return ReplyFormat(_obj({"lms": _obj(props)}), tokens, lambda d: parse_placement(d, obs))


def parse_placement(data: Any, obs: NodeObservation) -> Placement:
    """A deployer reply as a `Placement` (compact form: the cores are sized here).

    The model chooses what runs and how (mode, vGPUs); the arithmetic is
    deterministic: a running pod that keeps its mode (and vGPUs) keeps its
    cores (a resize restarts it); a new GPU pod gets `GPU_POD_CORES` (fewer,
    at least `GPU_POD_MIN_CORES`, shared equally when the cores left are short:
    the rule's `gpu_pod_cores`); new CPU pods share the cores left after those
    equally (whole cores, at least one). vGPUs
    count only in gpu mode (0 otherwise, at least 1 there). `check_placement`
    then judges the sums (memory, vRAM, cores, vGPUs) as for any placement.
    """
    if isinstance(data, dict) and isinstance(data.get("lms"), list):
        return Placement.model_validate(data)
    names = [s.name for s in obs.services]
    lms = _dict_of(data, "lms")
    problems = _keys_problems(lms, names, "LM")
    choice: dict[str, tuple[str, int]] = {}
    for lm in names:
        c = lms.get(lm)
        if lm not in lms:
            continue
        if not isinstance(c, dict):
            problems.append(f"{lm}: must be an object with mode and vgpus")
            continue
        mode, vgpus = c.get("mode"), c.get("vgpus", 0)
        if mode not in ("gpu", "cpu", "off"):
            problems.append(f"{lm}.mode must be gpu, cpu or off, not {mode!r}")
            continue
        if isinstance(vgpus, bool) or not isinstance(vgpus, int) or vgpus < 0:
            problems.append(f"{lm}.vgpus must be a whole number >= 0, not {vgpus!r}")
            continue
        choice[lm] = (mode, max(1, vgpus) if mode == "gpu" else 0)
    if problems:
        raise ValueError("; ".join(problems))
    spec = obs.node.spec
    running = {i.lm: i for i in obs.state.instances}
    cores: dict[str, float] = {}
    for lm, (mode, vgpus) in choice.items():
        inst = running.get(lm)
        if mode == "off":
            cores[lm] = 0.0
        elif inst is not None and inst.mode == mode and (mode == "cpu" or inst.vgpus == vgpus):
            cores[lm] = inst.cpu_cores
    new_gpu = [lm for lm, (mode, _) in choice.items() if mode == "gpu" and lm not in cores]
    if new_gpu:
        each = gpu_pod_cores(spec.cpu_cores - sum(cores.values()), len(new_gpu))
        cores.update(dict.fromkeys(new_gpu, each))
    new_cpu = [lm for lm, (mode, _) in choice.items() if mode == "cpu" and lm not in cores]
    if new_cpu:
        left = spec.cpu_cores - sum(cores.values())
        share = max(1.0, float(int(left / len(new_cpu))))
        cores.update(dict.fromkeys(new_cpu, share))
    return Placement(
        node=obs.node.name,
        lms=[
            LMPlacement(lm=lm, mode=choice[lm][0], cpu_cores=cores[lm], vgpus=choice[lm][1])
            for lm in names
        ],
    )


def routing_pairs(reference: RoutingMap) -> list[tuple[str, str, str]]:
    """(origin, lm, suggested destination or REJECT) of every pair to decide, sorted."""
    out = [(r.origin, r.lm, r.destination) for r in reference.routes]
    out += [(r.origin, r.lm, REJECT) for r in reference.rejections]
    return sorted(out)


def routing_format(view: SlotView) -> ReplyFormat[RoutingMap]:
    """The scheduler's reply: per "origin/lm" pair one destination among its candidates."""
    props: dict[str, Any] = {}
    for o, lm, suggested in routing_pairs(view.reference):
        dests = [c.node for c in view.ranked.get(lm, [])[:TOP_K]]
        if suggested != REJECT and suggested not in dests:
            dests.append(suggested)
        if view.admission:
            dests.append(REJECT)
        props[f"{o}/{lm}"] = {"type": "string", "enum": dests}
    tokens = TOKENS_BASE + TOKENS_PER_ROUTE * len(props)
    return ReplyFormat(
        _obj({"routes": _obj(props)}), tokens, lambda d: parse_routing(d, view.reference)
    )


def parse_routing(data: Any, reference: RoutingMap) -> RoutingMap:
    """A scheduler reply as a `RoutingMap` (compact form: {"origin/lm": destination})."""
    if isinstance(data, dict) and isinstance(data.get("routes"), list):
        return RoutingMap.model_validate(data)
    routes = _dict_of(data, "routes")
    pairs = {f"{o}/{lm}": (o, lm) for o, lm, _ in routing_pairs(reference)}
    problems = _keys_problems(routes, list(pairs), "pair")
    out, rejected = [], []
    for key, (o, lm) in pairs.items():
        dest = routes.get(key)
        if key not in routes:
            continue
        if not isinstance(dest, str) or not dest:
            problems.append(f"{key}: destination must be a node name or {REJECT}")
        elif dest == REJECT:
            rejected.append(Rejection(origin=o, lm=lm))
        else:
            out.append(Route(origin=o, lm=lm, destination=dest))
    if problems:
        raise ValueError("; ".join(problems))
    return RoutingMap(routes=out, rejections=rejected)


def policy_format(ctx: ClusterContext, reference: MacroPolicy) -> ReplyFormat[MacroPolicy]:
    """The planner's flat reply: relative weights per LM over its nodes, roles per worker."""
    routing = {
        lm: _obj({n: {"type": "number"} for n in ctx.feasible_nodes(lm)})
        for lm in ctx.lm_names
        if ctx.feasible_nodes(lm)
    }
    roles: dict[str, Any] = {}
    for n in ctx.workers:
        hostable = [lm for lm in ctx.lm_names if ctx.can_host(n.name, lm)]
        if hostable:
            roles[n.name] = {
                "type": "array",
                "items": {"type": "string", "enum": hostable},
                "maxItems": len(hostable),
            }
    weights = sum(len(v["properties"]) for v in routing.values())
    tokens = TOKENS_BASE + TOKENS_PER_WEIGHT * (
        weights + sum(len(v["items"]["enum"]) for v in roles.values())
    )
    schema = _obj({"routing": _obj(routing), "roles": _obj(roles)})
    return ReplyFormat(schema, tokens, lambda d: parse_policy(d, ctx))


def parse_policy(data: Any, ctx: ClusterContext) -> MacroPolicy:
    """A planner reply as a `MacroPolicy` (compact form: weights are relative, normalised here)."""
    if isinstance(data, dict) and isinstance(data.get("routing"), list):
        return MacroPolicy.model_validate(data)
    routing = _dict_of(data, "routing")
    roles = _dict_of(data, "roles")
    lms = [lm for lm in ctx.lm_names if ctx.feasible_nodes(lm)]
    problems = _keys_problems(routing, lms, "LM")
    out: list[LMRouting] = []
    for lm in lms:
        ws = routing.get(lm)
        if lm not in routing:
            continue
        if not isinstance(ws, dict):
            problems.append(f"routing.{lm} must be an object {{node: weight}}")
            continue
        bad = [
            f"routing.{lm}.{n}: weight {w!r} is not a number >= 0"
            for n, w in ws.items()
            if isinstance(w, bool) or not isinstance(w, int | float) or not w >= 0
        ]
        if bad:
            problems += bad
            continue
        total = float(sum(ws.values()))
        if total <= 0:
            problems.append(f"routing.{lm}: every weight is 0")
            continue
        out.append(
            LMRouting(
                lm=lm,
                weights=[RouteWeight(node=n, p=w / total) for n, w in ws.items() if w > 0],
            )
        )
    role_list: list[NodeRole] = []
    for n in ctx.workers:
        got = roles.get(n.name, [])
        if not isinstance(got, list) or not all(isinstance(x, str) for x in got):
            problems.append(f"roles.{n.name} must be a list of LM names")
            continue
        role_list.append(NodeRole(node=n.name, lms=list(dict.fromkeys(got))))
    problems += [
        f"roles: {k!r} is not a worker" for k in roles if k not in {n.name for n in ctx.workers}
    ]
    if problems:
        raise ValueError("; ".join(problems))
    return MacroPolicy(routing=out, roles=role_list, rationale=str(data.get("rationale", ""))[:500])
