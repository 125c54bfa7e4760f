"""Prompts that do not grow with the cluster: the agents' hierarchical form.

The flat prompts name every node: the planner's describes the cluster and a
policy over it (O(nodes x LMs)), the scheduler's lists every (origin, LM)
pair (O(origins x LMs)). At 1,000 nodes neither fits a small model's
context, nor its attention. The hierarchical form asks each agent only what
needs judgement, over aggregates, and a deterministic expander turns the
answer into the per-node decision, validated as before:

- planner: the cluster as node classes (identical servers, counted) and
  sites; per LM traffic and success; the previous policy and past cases as
  per-LM summaries. It answers a *demand factor* per LM (one of
  `DEMAND_FACTORS`: more or less capacity than the rule's water-filling
  would give it); the expander is that water-filling (rules/planner.py) run
  with the factors applied, so every node's weights and roles are the
  rule's arithmetic, feasible by construction.
- scheduler: per LM its top-k candidates (status, queue, weight, estimated
  completion) and how many pairs, prompts and origin sites it has this slot.
  It answers, per LM, which of those candidates to *avoid* this slot; the
  expander is the rule's earliest-completion routing and admission
  (rules/scheduler.py) with the avoided nodes taken out of that LM's plan for
  the slot (they stay usable as a last resort, like any unplanned node).

Both sizes depend on the LMs, the node classes and k, not on the node count
(`prompt_tokens` reports them). `choose_form` keeps the flat form -- the
paper's agents, and more freedom for a strong model -- while its prompt fits
`PROMPT_TOKEN_LIMIT`, and switches to the hierarchical one beyond.
The deployer's prompt describes its own node only and never grows.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping
from typing import Any, Literal

from lmedge.agents.llm import ReplyFormat, estimate_tokens
from lmedge.agents.memory import SelectedCase, select_cases
from lmedge.agents.rendering import (
    TOKENS_BASE,
    TOP_K,
    SlotView,
    _dict_of,
    _keys_problems,
    _obj,
    describe_node,
    describe_service,
    epoch_lines,
    planner_system,
    render_node,
    render_planning,
    render_slot,
    scheduler_system,
)
from lmedge.agents.rules.deployer import rule_placement
from lmedge.agents.rules.planner import RulePlannerState, plan_macro
from lmedge.agents.rules.scheduler import Plan, candidates, rule_routing
from lmedge.api import (
    Arrival,
    ClusterContext,
    EpochMetrics,
    LMRouting,
    LMStats,
    MacroPolicy,
    MemoryCase,
    NodeObservation,
    NodeRole,
    NodeState,
    PlanningObservation,
    RouteWeight,
    RoutingMap,
)

PromptForm = Literal["auto", "flat", "hierarchical"]
#: Largest flat prompt (system + user, estimated tokens) `auto` keeps; above it
#: the agent asks in the hierarchical form. Issue target: <= 4,000 at 1,000 nodes.
PROMPT_TOKEN_LIMIT = 4000
#: The planner's per-LM answer: the share of capacity it should get relative to
#: the rule's plan (1 = the rule's own plan).
DEMAND_FACTORS = (0.5, 0.75, 1.0, 1.5, 2.0)
TOKENS_PER_LM = 20


def choose_form(form: PromptForm, flat: tuple[str, str]) -> Literal["flat", "hierarchical"]:
    """The form to ask in: `form` unless auto; auto is flat while it fits the limit."""
    if form != "auto":
        return form
    return "flat" if estimate_tokens(flat[0] + flat[1]) <= PROMPT_TOKEN_LIMIT else "hierarchical"


# --- cluster summaries -----------------------------------------------------


def describe_classes(ctx: ClusterContext) -> str:
    """Node classes (identical servers, counted, with their sites) and the LMs."""
    classes: dict[str, list[str]] = {}
    for n in ctx.nodes:
        text = describe_node(n)[len(n.name) :]
        text = text.replace(f" ({n.spec.site})", "", 1) if n.spec.site else text
        classes.setdefault(text, []).append(n.spec.site or "-")
    sites = {n.spec.site for n in ctx.nodes}
    lines = [f"Servers ({len(ctx.nodes)} in {len(sites)} sites), by class:"]
    for text, where in classes.items():
        lines.append(f"- {len(where)} x{text.rstrip('.')} in {len(set(where))} site(s).")
    lines.append("LMs:")
    lines += [f"- {describe_service(s)}" for s in ctx.services]
    return "\n".join(lines)


def summarise_policy(ctx: ClusterContext, p: MacroPolicy) -> str:
    """Per LM: nodes weighted, and the share on GPU nodes (not per node)."""
    parts = []
    gpu = {n.name for n in ctx.workers if n.spec.has_gpu}
    for r in p.routing:
        ws = [w for w in r.weights if w.p > 0]
        on_gpu = sum(w.p for w in ws if w.node in gpu)
        parts.append(f"{r.lm} on {len(ws)} nodes ({on_gpu:.0%} of its traffic on GPU nodes)")
    return "; ".join(parts) + "."


# --- planner ----------------------------------------------------------------

PLANNER_HIERARCHICAL_OUTPUT = (
    'Output one JSON object {"demand": {"<lm>": factor, ...}} with every LM once: the capacity'
    " each LM should get relative to the reference plan, one of "
    + ", ".join(f"{f:g}" for f in DEMAND_FACTORS)
    + " (1 keeps the reference; more for an LM that fails or waits too long, less for one"
    " with room to spare). A capacity-proportional planner then spreads every LM over the"
    ' nodes. The shape, for another network: {"demand": {"a": 1.5, "b": 0.75}}'
)


def render_planning_hierarchical(
    obs: PlanningObservation, cases: list[SelectedCase]
) -> tuple[str, str]:
    """(system, user) prompts of the hierarchical planner (size independent of the node count)."""
    ctx = obs.context
    system = planner_system(ctx, PLANNER_HIERARCHICAL_OUTPUT)
    lines = [f"Epoch {obs.epoch}.", describe_classes(ctx)]
    lines += epoch_lines(obs)
    if obs.previous is not None:
        lines.append("Previous macro policy: " + summarise_policy(ctx, obs.previous))
    for sc in cases:
        c = sc.case
        mix = ", ".join(f"{lm} {n}" for lm, n in sorted(c.traffic.items()))
        obj = "n/a" if c.objective is None else f"{c.objective:.3f}"
        lines.append(
            f"Past case ({sc.label}), epoch {c.epoch}, traffic {mix}, objective {obj}: "
            + summarise_policy(ctx, c.policy)
        )
    reference = {"demand": dict.fromkeys(planner_lms(ctx), 1)}
    lines.append(
        "Reference (the capacity-proportional heuristic's own plan; change a factor only if"
        f" the evidence says so): {json.dumps(reference)}"
    )
    return system, "\n".join(lines)


def planner_lms(ctx: ClusterContext) -> list[str]:
    return [lm for lm in ctx.lm_names if ctx.feasible_nodes(lm)]


def demand_format(obs: PlanningObservation, state: RulePlannerState) -> ReplyFormat[MacroPolicy]:
    """The hierarchical planner's reply (a factor per LM) and its expander."""
    lms = planner_lms(obs.context)
    factor = {"type": "number", "enum": list(DEMAND_FACTORS)}
    schema = _obj({"demand": _obj(dict.fromkeys(lms, factor))})
    return ReplyFormat(
        schema, TOKENS_BASE + TOKENS_PER_LM * len(lms), lambda d: expand_demand(d, obs, state)
    )


def expand_demand(data: Any, obs: PlanningObservation, state: RulePlannerState) -> MacroPolicy:
    """The per-node policy of a demand-factor reply: the rule's water-filling, factors applied.

    `state` holds the rule's boost *after* this epoch's update (the rule ran
    first, for the reference), so a factor of 1 everywhere is the reference.
    """
    if isinstance(data, dict) and isinstance(data.get("routing"), list):
        return MacroPolicy.model_validate(data)
    ctx = obs.context
    lms = planner_lms(ctx)
    demand = _dict_of(data, "demand")
    problems = _keys_problems(demand, lms, "LM")
    for lm, f in demand.items():
        if isinstance(f, bool) or not isinstance(f, int | float) or f not in DEMAND_FACTORS:
            problems.append(
                f"demand.{lm}: {f!r} is not one of {', '.join(f'{x:g}' for x in DEMAND_FACTORS)}"
            )
    if problems:
        raise ValueError("; ".join(problems))
    boost = {lm: state.boost.get(lm, 1.0) * float(demand[lm]) for lm in lms}
    policy = plan_macro(ctx, obs.traffic, boost, obs.previous, follow_traffic=state.follow_traffic)
    changed = {lm: demand[lm] for lm in lms if demand[lm] != 1}
    why = ", ".join(f"{lm} x{f:g}" for lm, f in changed.items()) or "the reference plan"
    return policy.model_copy(update={"rationale": f"demand factors: {why}"})


# --- scheduler --------------------------------------------------------------


def scheduler_hierarchical_output(admission: bool) -> str:
    return (
        'Output one JSON object {"avoid": {"<lm>": ["<node>", ...], ...}} with every listed LM'
        " once: the candidates (of those listed for it) its requests should not be sent to this"
        " slot, [] for none. A router then sends every pair to the candidate that finishes it"
        " first among the others"
        + (", and refuses the sets that none can finish in time" if admission else "")
        + '. The shape, for another network: {"avoid": {"a": ["n2"], "b": []}}'
    )


def render_slot_hierarchical(view: SlotView) -> tuple[str, str]:
    """(system, user) prompts of the hierarchical scheduler: per LM, never per pair."""
    ctx = view.ctx
    system = scheduler_system(
        ctx, view.admit_fraction, scheduler_hierarchical_output(view.admission)
    )
    lines = [f"Epoch {view.epoch}, slot {view.slot}."]
    if view.macro is None:
        lines.append("No macro policy yet: use any candidate.")
    lines.append(
        "Per LM: this slot's pairs, prompts and origin sites, the heuristic's refusals, then its"
        " candidates best first (status: ready/pending running, role = will be started,"
        " draining = no longer planned here, off = not planned here; q = queued prompts;"
        " p = planner weight; est = estimated completion of one set):"
    )
    site = {n.name: n.spec.site for n in ctx.nodes}
    refused = Counter(r.lm for r in view.reference.rejections)
    for lm, cands in view.ranked.items():
        mine = [a for a in view.arrivals if a.lm == lm and a.requests > 0]
        sites = {site.get(a.origin) for a in mine}
        shown = "; ".join(
            f"{c.node} {c.status} q={c.backlog} p={c.p:.2f} est={c.cost_s:.0f}s"
            for c in cands[:TOP_K]
        )
        lines.append(
            f"- {lm}: {len(mine)} pairs, {sum(a.prompts for a in mine)} prompts from"
            f" {len(sites)} sites, {refused.get(lm, 0)} refused; {shown}"
        )
    ref: dict[str, dict[str, list[str]]] = {"avoid": {lm: [] for lm in view.ranked}}
    lines.append(f"Reference (the heuristic avoids none): {json.dumps(ref)}")
    return system, "\n".join(lines)


def avoid_format(view: SlotView) -> ReplyFormat[RoutingMap]:
    """The hierarchical scheduler's reply (nodes to avoid per LM) and its expander."""
    props: dict[str, Any] = {}
    for lm, cands in view.ranked.items():
        names = [c.node for c in cands[:TOP_K]]
        props[lm] = {
            "type": "array",
            "items": {"type": "string", "enum": names},
            "maxItems": max(0, len(names) - 1),
        }
    tokens = TOKENS_BASE + TOKENS_PER_LM * len(props)
    return ReplyFormat(_obj({"avoid": _obj(props)}), tokens, lambda d: expand_avoid(d, view))


def expand_avoid(data: Any, view: SlotView) -> RoutingMap:
    """The routing map of an avoid reply: the rule's routing with those nodes out of the plan."""
    if isinstance(data, dict) and isinstance(data.get("routes"), list):
        return RoutingMap.model_validate(data)
    avoid = _dict_of(data, "avoid")
    problems = _keys_problems(avoid, list(view.ranked), "LM")
    out: dict[str, set[str]] = {}
    for lm, nodes in avoid.items():
        allowed = [c.node for c in view.ranked.get(lm, [])[:TOP_K]]
        if not isinstance(nodes, list):
            problems.append(f"avoid.{lm} must be a list of node names")
            continue
        bad = [n for n in nodes if n not in allowed]
        if bad:
            problems.append(f"avoid.{lm}: {bad} are not among its candidates {allowed}")
        out[lm] = {n for n in nodes if n in allowed}
    if problems:
        raise ValueError("; ".join(problems))
    return rule_routing(
        view.ctx, without(view.macro, out), view.states, view.arrivals, view.admit_fraction
    )


def without(macro: MacroPolicy | None, avoid: Mapping[str, set[str]]) -> MacroPolicy | None:
    """`macro` with, per LM, the avoided nodes' weights and roles removed (weights renormalised).

    An LM whose every weighted node is avoided keeps its plan: avoiding all of
    them says nothing about where else to go.
    """
    if macro is None or not any(avoid.values()):
        return macro
    routing = []
    dropped: dict[str, set[str]] = {}
    for r in macro.routing:
        drop = avoid.get(r.lm, set())
        kept = [w for w in r.weights if w.node not in drop and w.p > 0]
        total = sum(w.p for w in kept)
        if not drop or total <= 0:
            routing.append(r)
            continue
        dropped[r.lm] = drop
        routing.append(
            LMRouting(lm=r.lm, weights=[RouteWeight(node=w.node, p=w.p / total) for w in kept])
        )
    roles = []
    for nr in macro.roles:
        lms = [lm for lm in nr.lms if nr.node not in dropped.get(lm, ())]
        modes = {lm: m for lm, m in nr.modes.items() if lm in lms}
        roles.append(NodeRole(node=nr.node, lms=lms, modes=modes))
    return macro.model_copy(update={"routing": routing, "roles": roles})


# --- prompt sizes ------------------------------------------------------------

Agent = Literal["planner", "scheduler", "deployer"]


def _metrics(ctx: ClusterContext) -> EpochMetrics:
    per_lm = [
        LMStats(lm=lm, arrivals=100, successes=90, success_ratio=0.9, mean_latency_s=30.0)
        for lm in ctx.lm_names
    ]
    return EpochMetrics(
        per_lm=per_lm,
        requests=100 * len(per_lm),
        successes=90 * len(per_lm),
        mean_latency_s=30.0,
        lm_mean_latency_s=30.0,
        jain=0.95,
        f_norm=0.9,
        t_norm=0.1,
        objective=0.1,
    )


def sample_planning(ctx: ClusterContext) -> tuple[PlanningObservation, MacroPolicy]:
    """A full planning observation for `ctx` (metrics, previous policy, memory), its rule plan."""
    traffic = dict.fromkeys(ctx.lm_names, 100)
    policy = plan_macro(ctx, traffic, {})
    m = _metrics(ctx)
    memory = [
        MemoryCase(epoch=e, traffic=traffic, policy=policy, metrics=m, objective=0.1 + e / 100)
        for e in range(3)
    ]
    obs = PlanningObservation(
        epoch=3, context=ctx, baseline=m, last=m, previous=policy, memory=memory, traffic=traffic
    )
    return obs, policy


def sample_slot(ctx: ClusterContext) -> tuple[list[Arrival], dict[str, NodeState], MacroPolicy]:
    """Arrivals of every LM at every worker (the most pairs a slot can have), idle nodes."""
    _, policy = sample_planning(ctx)
    arrivals = [
        Arrival(origin=n.name, lm=lm, requests=2, prompts=2)
        for n in ctx.workers
        for lm in ctx.lm_names
    ]
    states = {n.name: NodeState(name=n.name) for n in ctx.nodes}
    return arrivals, states, policy


def prompt_tokens(agent: Agent, ctx: ClusterContext, form: PromptForm = "auto") -> int:
    """Estimated prompt tokens (system + user, 4 characters a token) of one agent on `ctx`.

    The observation is the largest the agent sees: the planner with last
    epoch's and the baseline's metrics, a previous policy and three past
    cases; the scheduler with arrivals of every LM at every worker; the
    deployer on the worker with the longest prompt. Under `auto` the form
    the agent would choose.
    """
    if agent == "deployer":
        sizes = []
        for n in ctx.workers:
            node_obs = NodeObservation(
                slot=1, epoch=0, node=n, services=ctx.services, roles=ctx.lm_names,
                state=NodeState(name=n.name, backlog=dict.fromkeys(ctx.lm_names, 3)),
            )  # fmt: skip
            s, u = render_node(node_obs, rule_placement(node_obs))
            sizes.append(estimate_tokens(s + u))
        return max(sizes, default=0)
    if agent == "planner":
        obs, policy = sample_planning(ctx)
        cases = select_cases(obs.memory, obs.traffic)
        flat = render_planning(obs, cases, policy)
        hier = render_planning_hierarchical(obs, cases)
    else:
        arrivals, states, policy = sample_slot(ctx)
        reference = rule_routing(ctx, policy, states, arrivals)
        plan = Plan.of(ctx, policy)
        ranked = {lm: candidates(ctx, policy, states, lm, plan=plan) for lm in ctx.lm_names}
        view = SlotView(ctx, 1, 0, policy, states, arrivals, reference, ranked)
        flat = render_slot(view)
        hier = render_slot_hierarchical(view)
    chosen = choose_form(form, flat)
    s, u = flat if chosen == "flat" else hier
    return estimate_tokens(s + u)
