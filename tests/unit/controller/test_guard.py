"""The decision guard (lmedge.controller.guard): what every plugin decision goes through.

Pure logic: plugins are small in-process stand-ins; the guard calls them,
checks, repairs, falls back and stamps.
"""

from __future__ import annotations

from typing import Any

import pytest

from lmedge.api import (
    ClusterContext,
    Decision,
    LMPlacement,
    NodeObservation,
    NodeState,
    Placement,
    check_placement,
)
from lmedge.controller.guard import DecisionGuard


class Clock:
    def now(self) -> float:
        return 42.0

    def sleep_until(self, t: float) -> None:
        pass


class Fixed:
    """A deployer that proposes one fixed placement (or raises it, if an exception)."""

    name = "fixed"

    def __init__(self, value: Any) -> None:
        self.value = value

    def place(self, obs: NodeObservation) -> Decision[Placement]:
        if isinstance(self.value, Exception):
            raise self.value
        if not isinstance(self.value, Placement):
            return self.value  # type: ignore[no-any-return]
        return Decision[Placement](
            agent="deployer", policy=self.name, source="llm", value=self.value
        )


def _obs(ctx: ClusterContext, node: str, roles: list[str], **state: Any) -> NodeObservation:
    info = ctx.node(node)
    return NodeObservation(
        slot=7,
        epoch=0,
        node=info,
        services=ctx.services,
        roles=roles,
        state=NodeState(name=node, free_cpu_cores=info.spec.cpu_cores, **state),
        tau_s=ctx.loop.tau_s,
        slot_s=ctx.loop.slot_s,
    )


def _too_many_cores(ctx: ClusterContext, node: str) -> Placement:
    """lm1 and lm2 each on all the node's cores: infeasible, one of them must go."""
    cores = ctx.node(node).spec.cpu_cores
    lms = [LMPlacement(lm=lm, mode="cpu", cpu_cores=cores, vgpus=0) for lm in ("lm1", "lm2")]
    return Placement(node=node, lms=lms)


@pytest.mark.parametrize("role", ["lm1", "lm2"])
def test_a_repair_keeps_the_lm_of_the_role_intent(ctx: ClusterContext, role: str) -> None:
    # Without the role priority (the node agent's old repair) lm2, the later
    # one, was always switched off first, whatever the role said.
    guard = DecisionGuard("run", Clock())
    node = ctx.node("worker-1")
    obs = _obs(ctx, "worker-1", [role])
    d = guard.place(
        Fixed(_too_many_cores(ctx, "worker-1")), node, ctx.services, obs, epoch=0, slot=7
    )
    assert check_placement(d.value, node, ctx.services) == []
    assert d.value.by_lm()[role].mode == "cpu", "the role LM is kept"
    assert d.outcome == "replaced" and not d.validated and d.violations
    assert d.source == "llm", "a repair keeps the plugin's source; the audit says replaced"


def test_a_repair_then_prefers_the_lm_with_backlog(ctx: ClusterContext) -> None:
    guard = DecisionGuard("run", Clock())
    node = ctx.node("worker-1")
    obs = _obs(ctx, "worker-1", [], backlog={"lm1": 5})
    d = guard.place(
        Fixed(_too_many_cores(ctx, "worker-1")), node, ctx.services, obs, epoch=0, slot=7
    )
    assert d.value.by_lm()["lm1"].mode == "cpu" and d.value.by_lm()["lm2"].mode == "off"


@pytest.mark.parametrize(
    ("value", "error"),
    [(RuntimeError("exploded"), "RuntimeError: exploded"), ({"lms": []}, "returned dict")],
    ids=["raises", "wrong-type"],
)
def test_a_failed_call_ends_in_the_last_resort_stamped(
    ctx: ClusterContext, value: Any, error: str
) -> None:
    guard = DecisionGuard("run-9", Clock())
    node = ctx.node("worker-2")
    d = guard.place(Fixed(value), node, ctx.services, _obs(ctx, "worker-2", []), epoch=3, slot=7)
    assert (d.source, d.outcome) == ("fallback", "replaced")
    assert d.error is not None and error in d.error
    assert check_placement(d.value, node, ctx.services) == []
    assert (d.run, d.epoch, d.slot, d.node, d.sim_time_s) == ("run-9", 3, 7, "worker-2", 42.0)


def test_a_node_without_a_snapshot_gets_the_last_resort(ctx: ClusterContext) -> None:
    guard = DecisionGuard("run", Clock())
    node = ctx.node("worker-2")
    d = guard.place(Fixed(RuntimeError("unused")), node, ctx.services, None, epoch=0, slot=1)
    assert d.source == "fallback" and "no snapshot of worker-2" in (d.error or "")
    assert d.value.active() == {} and d.value.node == "worker-2"


def test_a_placement_for_another_node_is_not_used(ctx: ClusterContext) -> None:
    guard = DecisionGuard("run", Clock())
    node = ctx.node("worker-2")
    other = Placement(node="worker-3", lms=[])
    d = guard.place(Fixed(other), node, ctx.services, _obs(ctx, "worker-2", []), epoch=0, slot=1)
    assert d.value.node == "worker-2" and d.outcome == "replaced"
    assert any("not 'worker-2'" in v for v in d.violations)
