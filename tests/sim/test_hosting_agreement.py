"""Every layer agrees with `ClusterContext.modes` on which modes an LM can run in on a node.

On a grid of (node, LM) pairs that covers each requirement of the rule (a
control node, no GPU, too little memory or vRAM, fewer cores than an LM's
default, a GPU-only LM, a CPU-faster LM, and a cpu-or-gpu LM without a CPU
profile), each of these must say what `ctx.modes(node, lm)` says:

- the context's `can_host` / `feasible_nodes`;
- the agents: the deployer prompt's mode enum (`rendering.allowed_modes`) and
  the rules' `planned_mode`;
- the decision guard: `check_placement` accepts one pod of the LM alone in a
  mode exactly when the mode is open, and `nearest_feasible` never repairs
  into a shut mode;
- the emulator: `apply_placement` starts that pod exactly when the mode is open;
- every registered deployer places LMs only in open modes, and every
  registered router sends an LM only to a node with an open mode.

The LM without a CPU profile is the case the layers once split on: the
baselines and the feasibility check counted CPU as a mode for it, the agents
did not. The schema rejects such an LM (cpu-or-gpu needs
`cpuSecondsPerPrompt`) and the emulator has no CPU service time for it, so
CPU is a mode for it nowhere; it is built unvalidated here.
"""

from __future__ import annotations

import dataclasses
from functools import cache
from pathlib import Path

import pytest

from lmedge.agents.rendering import allowed_modes
from lmedge.agents.rules.capacity import planned_mode
from lmedge.api import (
    Arrival,
    ClusterContext,
    EdgeNodeSpec,
    LMPlacement,
    Mode,
    NodeInfo,
    NodeObservation,
    NodeState,
    Placement,
    ServiceInfo,
    SlotObservation,
    Snapshot,
    check_placement,
    nearest_feasible,
)
from lmedge.backends.emulated import EmulatedBackend
from lmedge.controller import catalog
from lmedge.controller.catalog import BuildContext
from lmedge.policies.full import full_placement
from lmedge.processes.plugins import register_plugins
from lmedge.sim import load_scenario
from tests.unit.api.conftest import NODES, SERVICES

TESTBED = Path(__file__).resolve().parents[2] / "examples" / "testbed"


def _with_cpu_seconds(sv: ServiceInfo, name: str, cpu_s: float | None) -> ServiceInfo:
    profile = sv.spec.profile.model_copy(update={"cpu_seconds_per_prompt": cpu_s})
    spec = sv.spec.model_copy(update={"profile": profile})
    return ServiceInfo.model_construct(name=name, spec=spec)


_TXT = next(s for s in SERVICES if s.name == "txt")
GRID_NODES = [
    *NODES,
    NodeInfo(
        name="few",
        spec=EdgeNodeSpec.model_validate(
            {"cpuCores": 2, "memoryGib": 24, "gpus": [{"vramGib": 24}], "vgpusPerGpu": 2}
        ),
    ),
]
GRID_SERVICES = [
    *SERVICES,
    _with_cpu_seconds(_TXT, "noprof", None),
    _with_cpu_seconds(_TXT, "cpufast", 1.0),
]
CTX = ClusterContext(nodes=GRID_NODES, services=GRID_SERVICES)
PAIRS = [(n.name, s.name) for n in GRID_NODES for s in GRID_SERVICES]
RUNNING: tuple[Mode, ...] = ("gpu", "cpu")


def test_the_grid_covers_every_requirement() -> None:
    table = {pair: CTX.modes(*pair) for pair in PAIRS}
    assert table["cpu", "noprof"] == () and table["gpu", "noprof"] == ("gpu",)
    assert table["gpu", "cpufast"] == ("cpu", "gpu")
    assert table["few", "txt"] == ("gpu", "cpu")  # 2 cores < the default 4
    assert table["small", "big"] == () and table["vram", "gen"] == ()
    assert table["cpu", "img"] == () and all(table["control", s.name] == () for s in SERVICES)


def _alone(node: str, lm: str, mode: Mode) -> Placement:
    """One pod of `lm` on `node` in `mode`: the LM's default cores, or all the node has."""
    spec = CTX.service(lm).spec
    cores = min(spec.default_cpu_cores, CTX.node(node).spec.cpu_cores)
    p = LMPlacement(lm=lm, mode=mode, cpu_cores=cores, vgpus=1 if mode == "gpu" else 0)
    return Placement(node=node, lms=[p])


def test_no_layer_runs_an_lm_without_a_cpu_profile_on_cpu() -> None:
    """The case the layers once split on, asked through what every layer had before."""
    node, sv = CTX.node("cpu"), CTX.service("noprof")
    assert allowed_modes(sv, node) == ["off"]  # the agents never offered it
    assert planned_mode(sv.spec, node.spec) == ""
    assert not CTX.can_host("cpu", "noprof")
    assert "cpu" not in CTX.feasible_nodes("noprof")
    assert check_placement(_alone("cpu", "noprof", "cpu"), node, [sv]) != []
    assert nearest_feasible(_alone("cpu", "noprof", "cpu"), node, [sv]).lms[0].mode == "off"
    assert full_placement(node, [sv]).lms[0].mode == "off"
    assert _emulator().apply_placement(_alone("cpu", "noprof", "cpu")).errors


@pytest.mark.parametrize(("node", "lm"), PAIRS, ids=[f"{n}-{s}" for n, s in PAIRS])
def test_context_agents_and_guard_agree(node: str, lm: str) -> None:
    want = CTX.modes(node, lm)
    n, sv = CTX.node(node), CTX.service(lm)
    assert CTX.can_host(node, lm) == bool(want)
    assert (node in CTX.feasible_nodes(lm)) == bool(want)
    # the agents: the deployer's reply schema and the rules' plan
    assert allowed_modes(sv, n) == [*want, "off"]
    planned = planned_mode(sv.spec, n.spec)
    assert planned in want if want else planned == ""
    # the decision guard
    for mode in RUNNING:
        placement = _alone(node, lm, mode)
        assert (check_placement(placement, n, [sv]) == []) == (mode in want), mode
        repaired = nearest_feasible(placement, n, [sv]).lms[0].mode
        assert repaired == mode if mode in want else repaired in (*want, "off")


@cache
def _emulator() -> EmulatedBackend:
    base = load_scenario(TESTBED)
    grid = dataclasses.replace(
        base, nodes=tuple(GRID_NODES), services=tuple(GRID_SERVICES), timeline=None
    )
    return EmulatedBackend(grid, seed=0)


@pytest.mark.parametrize(("node", "lm"), PAIRS, ids=[f"{n}-{s}" for n, s in PAIRS])
def test_the_emulator_starts_a_pod_exactly_in_the_open_modes(node: str, lm: str) -> None:
    be = _emulator()
    for mode in RUNNING:
        res = be.apply_placement(_alone(node, lm, mode))
        assert (res.started == [lm]) == (mode in CTX.modes(node, lm)), (mode, res.errors)
        assert res.started or res.errors
        off = LMPlacement(lm=lm, mode="off", cpu_cores=0, vgpus=0)
        be.apply_placement(Placement(node=node, lms=[off]))  # the node empty again


def _node_obs(node: str) -> NodeObservation:
    return NodeObservation(
        slot=1,
        epoch=0,
        node=CTX.node(node),
        services=CTX.services,
        roles=list(CTX.lm_names),
        state=NodeState(name=node, backlog=dict.fromkeys(CTX.lm_names, 8)),
    )


def _slot_obs() -> SlotObservation:
    arrivals = [
        Arrival(origin=n.name, lm=lm, requests=2, prompts=4)
        for n in CTX.nodes
        for lm in CTX.lm_names
    ]
    states = [NodeState(name=n.name, backlog=dict.fromkeys(CTX.lm_names, 8)) for n in CTX.nodes]
    snap = Snapshot(slot=1, time_s=30.0, nodes=states)
    return SlotObservation(
        slot=1, epoch=0, context=CTX, macro=None, snapshot=snap, arrivals=arrivals
    )


def _registered(kind: catalog.Kind) -> list[str]:
    register_plugins()  # parametrize runs at collection, before the session fixture
    return sorted(catalog.ROUTERS if kind == "router" else catalog.DEPLOYERS)


@pytest.mark.parametrize("name", _registered("router"))
def test_every_router_sends_an_lm_only_where_it_can_run(name: str) -> None:
    routing = catalog.build_router(name, BuildContext(CTX, 0)).route(_slot_obs()).value
    assert routing.routes
    for r in routing.routes:
        model = r.model or r.lm
        assert CTX.modes(r.destination, model), (r.origin, r.lm, r.destination)


@pytest.mark.parametrize("name", _registered("deployer"))
def test_every_deployer_places_an_lm_only_in_its_open_modes(name: str) -> None:
    router = None
    joint = catalog.entry("deployer", name).capabilities.joint_router
    if joint:
        router = catalog.build_router(joint, BuildContext(CTX, 0))
        router.route(_slot_obs())
    deployer = catalog.build_deployer(name, BuildContext(CTX, 0, router=router))
    active = 0
    for n in CTX.nodes:
        for p in deployer.place(_node_obs(n.name)).value.lms:
            assert p.mode == "off" or p.mode in CTX.modes(n.name, p.lm), (n.name, p)
            active += p.mode != "off"
    assert active  # each deployer did place something
