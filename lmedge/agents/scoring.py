"""The scoring guard: an LLM proposal runs only when it is estimated no worse than the rule.

An LLM can return a decision that is perfectly valid — every name known,
every budget kept — and still harmful: "route everything to one node" passes
`check_routing_map`. Validation cannot catch that, so every LLM proposal that
passed validation is scored here by a deterministic estimate of its effect,
and so is the rule backend's decision for the same observation. The proposal
is executed only when

    J_est(llm) <= J_est(rule) + margin

(`margin` is a setting, `guard_margin`, per agent); otherwise the rule's
decision runs. Both estimates and the choice go into `Decision.guard`.

It judges quality only. Feasibility is the decision guard's job
(`lmedge.controller.guard`), which checks every plugin's decision, LLM or
not, and repairs or replaces an infeasible one.

The estimate is the paper's objective J = lam T_norm + (1 - lam)(1 - F_norm)
(`lmedge.metrics`) over what the decision affects, computed with the queue
and service model the rule agents already use (`rules/capacity.py`,
`rules/scheduler.py`): a set of prompts routed to a node waits for the
queue ahead of it there (its backlog plus what this map sends there first),
a cold start when the LM is not running yet, and the uplink transfer; its
requests then finish one after the other at the instance's rate, and those
finishing after the deadline count as failures.

- routing map (per slot): this slot's arrivals, taken in one fixed order
  (smallest set first) for both candidates so neither is favoured; a
  rejected pair is all failures, as in the metrics;
- placement (per node and slot): the node's backlog per LM (the queue plus
  what the router has just sent there) served by the placement's instances:
  an unchanged instance keeps its rate, a new or resized one pays a cold
  start, an LM switched off with queued work fails it all;
- macro policy (per epoch): last epoch's traffic per LM spread by the
  policy's weights over nodes, each node's planned capacity for the LM
  (its role, shared with the node's other role LMs) as an M/M/1 queue. The
  first epoch has no traffic to estimate with: both score 0 and the LLM's
  policy runs.

The estimate is coarse by design (it sees one slot, or one epoch's average);
its job is to catch a proposal that is clearly worse than the rule, which
is what the margin is for, not to rank close ones.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

from lmedge.agents.rules.capacity import (
    best_rate,
    cpu_rate,
    gpu_rate,
    instance_rate,
    planned_mode,
)
from lmedge.agents.rules.scheduler import transfer_s
from lmedge.api import (
    EdgeNodeSpec,
    MacroPolicy,
    NodeObservation,
    Placement,
    PlanningObservation,
    RoutingMap,
    SlotObservation,
)
from lmedge.api.constants import COLD_START_S
from lmedge.api.decisions import GuardAudit, GuardScore
from lmedge.metrics import LAMBDA, fairness, objective

T = TypeVar("T", MacroPolicy, RoutingMap, Placement)

#: Default margin: an LLM proposal may be estimated up to 0.02 worse in J
#: (objective units, J in [0, 1]) than the rule's and still run. Seed-to-seed
#: noise of the testbed's objective is about that size, so a smaller margin
#: would overrule the LLM on estimates the model cannot tell apart.
GUARD_MARGIN = 0.02


@dataclass
class _LMTally:
    """Estimated requests, successes and normalized latency of one LM."""

    requests: float = 0.0
    successes: float = 0.0
    latency_norm: float = 0.0  # sum of T / tau over the successes


def _serve(
    tally: _LMTally, requests: int, prompts: int, start_s: float, rate: float, tau: float
) -> None:
    """Add a set of `requests` (`prompts` in all) that starts after `start_s` at `rate` prompts/s.

    Its requests finish one after the other, evenly spread over the set's
    service time; those finishing after `tau` are failures.
    """
    if requests <= 0:
        return
    tally.requests += requests
    if rate <= 0 or start_s >= tau:
        return
    service = max(prompts, 1) / rate
    step = service / requests  # service time of one request of the set
    k = min(requests, math.floor((tau - start_s) / step))
    if k <= 0:
        return
    tally.successes += k
    # sum over i = 1..k of (start + i step) / tau
    tally.latency_norm += (k * start_s + step * k * (k + 1) / 2) / tau


def _objective(tallies: Iterable[_LMTally], lam: float) -> float:
    """J over the LMs with requests, as `lmedge.metrics.window_metrics` computes it."""
    rows = [t for t in tallies if t.requests > 0]
    if not rows:
        return 0.0
    ratios = [t.successes / t.requests for t in rows]
    _, f_norm = fairness(ratios)
    succ = sum(t.successes for t in rows)
    t_norm = sum(t.latency_norm for t in rows) / succ if succ else 1.0
    return objective(t_norm, f_norm if f_norm is not None else 0.0, lam)


def routing_objective(obs: SlotObservation, routing: RoutingMap) -> float:
    """Estimated J of this slot's arrivals under `routing` (see the module docstring)."""
    ctx = obs.context
    states = {n.name: n for n in obs.snapshot.nodes}
    routes = {(r.origin, r.lm): r for r in routing.routes}
    rejected = routing.rejected()
    tallies: dict[str, _LMTally] = {}
    ahead: dict[tuple[str, str], int] = {}
    for a in sorted(obs.arrivals, key=lambda x: (x.prompts, x.origin, x.lm)):
        if a.requests <= 0 or not ctx.has_service(a.lm):
            continue
        route = routes.get((a.origin, a.lm))
        lm = route.serving_lm if route is not None else a.lm
        tally = tallies.setdefault(a.lm, _LMTally())
        tau = ctx.deadline_s(a.lm)
        if (a.origin, a.lm) in rejected or route is None or not ctx.has_service(lm):
            _serve(tally, a.requests, a.prompts, tau, 0.0, tau)  # all failures
            continue
        dest = route.destination
        if not ctx.has_node(dest):
            _serve(tally, a.requests, a.prompts, tau, 0.0, tau)
            continue
        svc, node = ctx.service(lm).spec, ctx.node(dest).spec
        state = states.get(dest)
        inst = state.instance(lm) if state is not None else None
        if inst is not None:
            rate = instance_rate(svc, node, inst)
            wait = COLD_START_S / 2 if inst.status == "pending" else 0.0
        else:
            # the deployer starts an LM the router has just sent work to
            rate, wait = best_rate(svc, node), COLD_START_S
        backlog = (state.backlog.get(lm, 0) if state is not None else 0) + ahead.get((dest, lm), 0)
        start = wait + transfer_s(ctx, a.origin, dest, svc.profile.request_kib * a.prompts)
        if rate > 0:
            start += backlog / rate
        _serve(tally, a.requests, a.prompts, start, rate, tau)
        ahead[(dest, lm)] = ahead.get((dest, lm), 0) + a.prompts
    return _objective(tallies.values(), ctx.loop.lam)


def placement_objective(obs: NodeObservation, placement: Placement, lam: float = LAMBDA) -> float:
    """Estimated J of the node's backlog served by `placement` (see the module docstring).

    A node observation does not carry the run's lambda; the deployer passes it.
    """
    node = obs.node.spec
    running = {i.lm: i for i in obs.state.instances}
    chosen = placement.by_lm()
    tallies: list[_LMTally] = []
    for s in obs.services:
        backlog = obs.state.backlog.get(s.name, 0)
        if backlog <= 0:
            continue
        tally = _LMTally()
        tallies.append(tally)
        tau = s.spec.deadline_s or obs.tau_s
        p = chosen.get(s.name)
        inst = running.get(s.name)
        if p is None or p.mode == "off":
            _serve(tally, backlog, backlog, tau, 0.0, tau)
            continue
        same = inst is not None and (inst.mode, inst.cpu_cores, inst.vgpus) == (
            p.mode,
            p.cpu_cores,
            p.vgpus,
        )
        if same and inst is not None:
            rate = instance_rate(s.spec, node, inst)
            wait = COLD_START_S / 2 if inst.status == "pending" else 0.0
        else:  # a start or a resize (which restarts the pod)
            rate = (
                gpu_rate(s.spec, node, p.vgpus)
                if p.mode == "gpu"
                else cpu_rate(s.spec, p.cpu_cores)
            )
            wait = COLD_START_S
        # each queued prompt stands for one request: the queue does not say more
        _serve(tally, backlog, backlog, wait, rate, tau)
    return _objective(tallies, lam)


def macro_objective(obs: PlanningObservation, policy: MacroPolicy) -> float:
    """Estimated J of last epoch's traffic under `policy` (see the module docstring)."""
    ctx = obs.context
    if not obs.traffic:
        return 0.0
    epoch_s = ctx.loop.epoch_slots * ctx.loop.slot_s
    roles = {n: set(lms) for n, lms in policy.role_map().items()}
    weights = policy.weights()
    tallies: list[_LMTally] = []
    for lm, prompts in sorted(obs.traffic.items()):
        if prompts <= 0 or not ctx.has_service(lm):
            continue
        svc = ctx.service(lm).spec
        tau = ctx.deadline_s(lm)
        demand = prompts / epoch_s  # prompts per second
        tally = _LMTally()
        tallies.append(tally)
        for n, w in sorted(weights.get(lm, {}).items()):
            if w <= 0:
                continue
            share = w * prompts
            if not ctx.has_node(n):
                _serve(tally, max(1, round(share)), max(1, round(share)), tau, 0.0, tau)
                continue
            node = ctx.node(n).spec
            mode = planned_mode(svc, node)
            role = roles.get(n, set())
            # LMs planned in the same mode on the node share its capacity
            sharing = sum(
                1
                for other in role | {lm}
                if ctx.has_service(other) and planned_mode(ctx.service(other).spec, node) == mode
            )
            # a weight where the LM is not in the role still gets it started on
            # demand (the deployer serves queued work), at the same shared rate
            rate = best_rate(svc, node) * _capacity_units(node, mode) / max(sharing, 1)
            tally.requests += share
            if rate <= 0:
                continue
            rho = w * demand / rate
            served = share if rho < 1 else share / rho
            sojourn = min(tau, (1.0 / rate) / max(1e-9, 1.0 - min(rho, 0.999)))
            tally.successes += served
            tally.latency_norm += served * sojourn / tau
    return _objective(tallies, ctx.loop.lam)


def _capacity_units(node: EdgeNodeSpec, mode: str) -> float:
    """How many typical instances of `mode` the node runs at once (`best_rate` is one)."""
    if mode == "gpu":
        return float(max(1, node.vgpus_per_gpu * len(node.gpus)))
    return 2.0  # `best_rate` gives a CPU instance half the node's cores


def choose(
    llm_value: T,
    rule_value: T,
    score: Callable[[T], float],
    margin: float,
) -> tuple[T, GuardAudit]:
    """The value to execute, LLM's or rule's, and the audit of the comparison.

    Ties and anything within `margin` go to the LLM: the guard is there to
    stop harm, not to second-guess a model that is as good as the rule.
    """
    j_llm, j_rule = score(llm_value), score(rule_value)
    ok = j_llm <= j_rule + margin
    reason = (
        f"estimated J {j_llm:.4f} within {margin:g} of the rule's {j_rule:.4f}"
        if ok
        else f"estimated J {j_llm:.4f} exceeds the rule's {j_rule:.4f} by more than {margin:g}"
    )
    audit = GuardAudit(
        margin=margin,
        candidates=[
            GuardScore(source="llm", objective=round(j_llm, 6)),
            GuardScore(source="rule", objective=round(j_rule, 6)),
        ],
        chosen="llm" if ok else "rule",
        reason=reason,
    )
    return (llm_value if ok else rule_value), audit
