"""Observation builders over the paper's testbed manifests, shared by the policy tests."""

from __future__ import annotations

from functools import cache
from pathlib import Path

from lmedge.api import (
    Arrival,
    ClusterContext,
    InstanceState,
    MacroPolicy,
    NodeObservation,
    NodeState,
    SlotObservation,
    Snapshot,
)
from lmedge.api.manifests import load_resources

ROOT = Path(__file__).resolve().parents[4]
TESTBED = ROOT / "examples" / "testbed"


@cache
def paper_testbed() -> ClusterContext:
    nodes, services = load_resources(TESTBED)
    return ClusterContext(nodes=nodes, services=services)


def node_obs(
    node: str,
    backlog: dict[str, int] | None = None,
    running: dict[str, str] | None = None,
    ctx: ClusterContext | None = None,
    slot: int = 1,
    util: tuple[float, float, float] = (0.0, 0.0, 0.0),
) -> NodeObservation:
    """A deployer observation: `running` maps LM -> "gpu"/"cpu" for ready instances.

    `util` is the measured (gpu, cpu, memory) utilization of the node.
    """
    ctx = ctx or paper_testbed()
    info = ctx.node(node)
    instances = [
        InstanceState(
            lm=lm,
            mode=mode,  # type: ignore[arg-type]
            cpu_cores=ctx.service(lm).spec.default_cpu_cores,
            vgpus=1 if mode == "gpu" else 0,
            status="ready",
        )
        for lm, mode in (running or {}).items()
    ]
    return NodeObservation(
        slot=slot,
        epoch=0,
        node=info,
        services=ctx.services,
        roles=[],
        state=NodeState(
            name=node,
            backlog=dict(backlog or {}),
            instances=instances,
            gpu_util=util[0],
            cpu_util=util[1],
            free_memory_gib=info.spec.memory_gib * (1.0 - util[2]),
        ),
    )


def slot_obs(
    arrivals: list[tuple[str, str, int]],
    backlog: dict[str, dict[str, int]] | None = None,
    running: dict[str, dict[str, str]] | None = None,
    ctx: ClusterContext | None = None,
    slot: int = 1,
    macro: MacroPolicy | None = None,
) -> SlotObservation:
    """A router observation: arrivals as (origin, lm, prompts), one request each."""
    ctx = ctx or paper_testbed()
    nodes = []
    for n in ctx.nodes:
        obs = node_obs(n.name, (backlog or {}).get(n.name), (running or {}).get(n.name), ctx, slot)
        nodes.append(obs.state)
    return SlotObservation(
        slot=slot,
        epoch=0,
        context=ctx,
        macro=macro,
        snapshot=Snapshot(slot=slot, time_s=slot * ctx.loop.slot_s, nodes=nodes),
        arrivals=[Arrival(origin=o, lm=lm, requests=1, prompts=k) for o, lm, k in arrivals],
    )
