"""The decision guard: the one way a plugin's decision reaches the cluster.

The controller loop (planner, router, in-process deployers) and every node
agent (its own deployer) go through `DecisionGuard`, so one slot follows the
same rules whichever process decides:

1. **call** the plugin, timing it (`latency_s`, wall time); an exception, or
   something that is not a `Decision` of the right kind, is a failure;
2. **validate** the value with the feasibility checks of `lmedge.api`;
3. **repair** an infeasible placement to `nearest_feasible`, keeping the LMs
   in the node's role intent longest, then those with the most backlog
   (`repair_priority`); routing maps and macro policies are not repaired;
4. **fall back** when the call failed, the value cannot be checked, or the
   repair is still infeasible: the last resort of docs/design.md "Control
   loop" (`fallbacks.py`: a random macro policy, local routing, the running
   set), each feasible by construction. (An LLM agent has already fallen
   back to its own rule decision inside the plugin, `lmedge.agents.core`; the
   last resort runs only when that failed too.)
5. **stamp** the audit: run, epoch, slot, node, latency, backend clock.

A replaced value keeps the reasons (`outcome="replaced"`, violations, error).
Nothing a plugin does stops the loop.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar, cast

from lmedge.api import (
    Arrival,
    Clock,
    ClusterContext,
    Decision,
    Deployer,
    MacroPolicy,
    NodeInfo,
    NodeObservation,
    NodeState,
    Placement,
    Planner,
    PlanningObservation,
    Router,
    RoutingMap,
    ServiceInfo,
    Violation,
    check_macro_policy,
    check_placement,
    check_routing_map,
    nearest_feasible,
)
from lmedge.api.decisions import AgentKind, cap_text, cap_violations
from lmedge.controller.fallbacks import (
    fallback_macro_policy,
    fallback_placement,
    fallback_routing,
)

log = logging.getLogger(__name__)

V = TypeVar("V", MacroPolicy, RoutingMap, Placement)

#: Repair priority bonus of an LM in the node's role intent; above any backlog.
ROLE_PRIORITY = 1e9


def repair_priority(role: Sequence[str], state: NodeState | None) -> dict[str, float]:
    """Which LMs a repair keeps longest: the node's role intent first, then by backlog."""
    backlog = state.backlog if state is not None else {}
    lms = set(role) | set(backlog)
    return {lm: (ROLE_PRIORITY if lm in role else 0.0) + backlog.get(lm, 0) for lm in lms}


class DecisionGuard:
    """Calls, validates, repairs, falls back and stamps, for one run (module docstring)."""

    def __init__(self, run_id: str, clock: Clock, *, seed_rng: random.Random | None = None) -> None:
        self.run_id = run_id
        self.clock = clock
        #: The last-resort planner's random stream (seeded by the run, deterministic).
        self.rng = seed_rng if seed_rng is not None else random.Random(0)

    # -- the three tiers ------------------------------------------------------

    def plan(
        self, planner: Planner, obs: PlanningObservation, *, slot: int
    ) -> Decision[MacroPolicy]:
        """The planner's macro policy for `obs`, validated; the random policy as last resort."""
        ctx = obs.context
        d, failed = self.call("planner", planner.name, MacroPolicy, lambda: planner.plan(obs))
        d = self.validate(
            d,
            failed=failed,
            check=lambda v: check_macro_policy(v, ctx),
            repair=None,
            fallback=lambda: fallback_macro_policy(ctx, self.rng),
        )
        return self.stamp(d, obs.epoch, slot, None)

    def route(
        self,
        router: Router,
        call: Callable[[], Decision[RoutingMap]],
        ctx: ClusterContext,
        arrivals: list[Arrival],
        *,
        epoch: int,
        slot: int,
    ) -> Decision[RoutingMap]:
        """The routing map `call` returns, checked against `arrivals`; local routing as last resort.

        `call` wraps `router.route` so the caller can map request classes
        inside the guarded call (a value it cannot map is a failure too).
        """
        d, failed = self.call("scheduler", router.name, RoutingMap, call)
        d = self.validate(
            d,
            failed=failed,
            check=lambda v: check_routing_map(v, ctx, arrivals),
            repair=None,
            fallback=lambda: fallback_routing(ctx, arrivals),
        )
        return self.stamp(d, epoch, slot, None)

    def place(
        self,
        deployer: Deployer,
        node: NodeInfo,
        services: Sequence[ServiceInfo],
        obs: NodeObservation | None,
        *,
        epoch: int,
        slot: int,
    ) -> Decision[Placement]:
        """The deployer's placement for `obs`, repaired with the role priority if infeasible.

        `obs` is None when the node has no snapshot this slot: a failure, and
        the last resort runs without a state (every LM off).
        """
        state = obs.state if obs is not None else None
        if obs is None:
            error = f"no snapshot of {node.name}"
            d, failed = error_decision("deployer", deployer.name, error, Placement), True
        else:
            d, failed = self.call("deployer", deployer.name, Placement, lambda: deployer.place(obs))
        roles = obs.roles if obs is not None else ()
        d = self.validate(
            d,
            failed=failed,
            check=lambda v: check_placement(v, node, services),
            repair=lambda v: nearest_feasible(v, node, services, repair_priority(roles, state)),
            fallback=lambda: fallback_placement(node, services, state),
        )
        return self.stamp(d, epoch, slot, node.name)

    # -- the steps --------------------------------------------------------------

    def call(
        self, agent: AgentKind, name: str, kind: type[V], call: Callable[[], Decision[V]]
    ) -> tuple[Decision[V], bool]:
        """Call a plugin, timing it: (decision, failed).

        A failure (an exception, or something that is not a `Decision` of the
        right kind) becomes a placeholder decision with the error and `failed`.
        A plugin may itself report an `error` (say, an LLM timeout it covered
        with its own rule); its value is then still validated and used.
        """
        started = time.perf_counter()
        failed = False
        try:
            d = call()
            if not isinstance(d, Decision) or not isinstance(d.value, kind):
                got = type(d.value if isinstance(d, Decision) else d).__name__
                d = error_decision(agent, name, f"returned {got}, not a {kind.__name__}", kind)
                failed = True
        except Exception as exc:  # a plugin bug must not stop the cluster
            d = error_decision(agent, name, f"{type(exc).__name__}: {exc}", kind)
            failed = True
        return d.model_copy(update={"latency_s": time.perf_counter() - started}), failed

    def validate(
        self,
        d: Decision[V],
        *,
        failed: bool,
        check: Callable[[V], list[Violation]],
        repair: Callable[[V], V] | None,
        fallback: Callable[[], V],
    ) -> Decision[V]:
        """Accept a feasible value; otherwise repair it, or fall back, keeping the reasons."""
        if failed:
            return d.model_copy(
                update={"value": fallback(), "source": "fallback", "outcome": "replaced"}
            )
        try:
            found: list[str] = [str(v) for v in check(d.value)]
        except Exception as exc:  # a value the checks choke on is not a usable value
            log.exception("checking a %s decision of %s failed", d.agent, d.policy)
            return d.model_copy(
                update={
                    "value": fallback(),
                    "source": "fallback",
                    "outcome": "replaced",
                    "validated": False,
                    "error": cap_text(f"check failed: {type(exc).__name__}: {exc}"),
                }
            )
        if not found:
            return d
        update: dict[str, Any] = {
            "validated": False,
            "outcome": "replaced",
            "violations": cap_violations([*d.violations, *found]),
        }
        if repair is not None:
            try:
                repaired = repair(d.value)
                if not check(repaired):
                    return d.model_copy(update={**update, "value": repaired})
            except Exception:  # the fallback below is feasible by construction
                log.exception("repairing a %s decision of %s failed", d.agent, d.policy)
        return d.model_copy(update={**update, "value": fallback(), "source": "fallback"})

    def stamp(self, d: Decision[V], epoch: int, slot: int, node: str | None) -> Decision[V]:
        """The audit fields only the runner knows: run, epoch, slot, node, backend clock."""
        return d.model_copy(
            update={
                "run": self.run_id,
                "epoch": epoch,
                "slot": slot,
                "node": node,
                "sim_time_s": self.clock.now(),
            }
        )


def error_decision(agent: AgentKind, name: str, error: str, kind: type[V]) -> Decision[V]:
    """A placeholder for a failed call; `validate` swaps in the fallback value."""
    empty: Any
    if kind is MacroPolicy:
        empty = MacroPolicy(routing=[], roles=[])
    elif kind is RoutingMap:
        empty = RoutingMap(routes=[])
    else:
        empty = Placement(node="-", lms=[])
    made: Any = Decision[kind](  # type: ignore[valid-type]
        agent=agent,
        policy=name,
        source="fallback",
        value=empty,
        parsed=False,
        validated=False,
        outcome="replaced",
        error=error,
    )
    return cast("Decision[V]", made)
