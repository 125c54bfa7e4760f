"""Deployer `agentic`: the LM Deployment Agents (paper §IV-B2), one per node per slot.

Each call sees one node only: its role intent, per-LM backlog, deployment
status and headroom, with a system prompt specialised to the node's hardware
(CPU-only, single-GPU, multi-GPU). It returns that node's `Placement`.
Without an endpoint the rule backend (rules/deployer.py) decides. A failed
LLM call falls back to the rule's placement; the running set mapped to the
nearest feasible placement (paper §V-D2) is only the last resort, when the
rule fails too: on a cold start it keeps the node empty. A valid LLM
placement runs only if the scoring guard (scoring.py) estimates it no worse
than the rule's by more than the margin.
Its only state between calls is the rule's `PodAges` (per node, when each
pod was seen to start: step 3's hold against swapping pods back and forth);
each node's entry is its own, so the controller may call it for several
nodes at once from different threads.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lmedge.agents.core import AgentCore
from lmedge.agents.params import DeployerParams
from lmedge.agents.rendering import placement_format, render_node
from lmedge.agents.rules.deployer import PodAges, rule_placement
from lmedge.agents.scoring import placement_objective
from lmedge.api import (
    Capabilities,
    ClusterContext,
    Decision,
    LMPlacement,
    NodeObservation,
    Placement,
    check_placement,
    nearest_feasible,
)
from lmedge.metrics import LAMBDA
from lmedge.policies.kit.params import parse_params


def keep_running(obs: NodeObservation) -> Placement:
    """The fallback: what runs now, mapped to the nearest feasible placement."""
    lms = [
        LMPlacement(lm=i.lm, mode=i.mode, cpu_cores=i.cpu_cores, vgpus=i.vgpus)
        for i in obs.state.instances
    ]
    return nearest_feasible(Placement(node=obs.node.name, lms=lms), obs.node, obs.services)


class AgenticDeployer:
    """Tier 2: per-node LLM deployer; rule role-first placement without an endpoint."""

    name = "agentic"

    def __init__(self, core: AgentCore, lam: float = LAMBDA, *, follow_modes: bool = False) -> None:
        self.core = core
        #: Whether the rule starts LMs in the plan's modes (`rule_placement`).
        self.follow_modes = follow_modes
        #: The run's objective weight, for the scoring guard's estimate.
        self.lam = lam
        #: When each node's pods were seen to start (the rule's re-fit hold).
        self.ages = PodAges()
        #: With an endpoint each call waits on HTTP: the loop then runs the nodes'
        #: deployers concurrently, as the paper's per-node agents are.
        self.capabilities = Capabilities(io_bound=core.uses_llm)

    @classmethod
    def build(cls, ctx: ClusterContext, params: Mapping[str, Any]) -> AgenticDeployer:
        """Parameters: `DeployerParams` (params.py); a bad one is a `ConfigError` naming it."""
        p = parse_params(DeployerParams, params, f"deployer {cls.name}")
        core = AgentCore.from_params("deployer", p, ctx.loop.slot_s, cls.name)
        return cls(core, ctx.loop.lam, follow_modes=p.follow_modes)

    def place(self, obs: NodeObservation) -> Decision[Placement]:
        reference = rule_placement(
            obs, follow_modes=self.follow_modes, lam=self.lam, young=self.ages.young(obs)
        )
        return self.core.decide(
            model=Placement,
            schema_name="placement",
            prompts=lambda: render_node(obs, reference),
            reply_format=lambda: placement_format(obs),
            rule=lambda: reference,
            check=lambda v: [str(x) for x in check_placement(v, obs.node, obs.services)],
            fallback=lambda: keep_running(obs),
            score=lambda v: placement_objective(obs, v, self.lam),
            node=obs.node.name,
        )
