"""What each agent sees. Only system telemetry: never a user's prompt text.

`ClusterContext` is the static part (capacities, LM footprints, constraints);
`Snapshot` the live state at the end of the previous slot; the three
observation types are what the Planner, Router and Deployer receive.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any, Literal

from pydantic import Field

from lmedge.api import hosting
from lmedge.api.base import WireModel
from lmedge.api.constants import SLOT_S, TAU_S, LoopConstants
from lmedge.api.decisions import MacroPolicy, Mode, Placement, PlannedMode
from lmedge.api.engine_telemetry import EngineTelemetry
from lmedge.api.resources import EdgeNodeSpec, LMServiceSpec


class NodeInfo(WireModel):
    name: str
    spec: EdgeNodeSpec


class ServiceInfo(WireModel):
    name: str
    spec: LMServiceSpec

    def serves_class(self, request_class: str) -> bool:
        return request_class == self.name or request_class in self.spec.serves


class ClusterContext(WireModel):
    """Static cluster description plus the control-loop constants (`loop`)."""

    nodes: list[NodeInfo]
    services: list[ServiceInfo]
    loop: LoopConstants = Field(
        default_factory=LoopConstants, description="Slot, epoch, deadline tau, lambda."
    )

    @cached_property
    def _nodes(self) -> dict[str, NodeInfo]:
        return {n.name: n for n in self.nodes}

    @cached_property
    def _services(self) -> dict[str, ServiceInfo]:
        return {s.name: s for s in self.services}

    def node(self, name: str) -> NodeInfo:
        return self._nodes[name]

    def service(self, name: str) -> ServiceInfo:
        return self._services[name]

    def has_node(self, name: str) -> bool:
        return name in self._nodes

    def has_service(self, name: str) -> bool:
        return name in self._services

    @cached_property
    def memo(self) -> dict[str, Any]:
        """A cache for values derived from this context alone, kept as long as the context.

        A context never changes (a changed cluster is a new context), so a
        policy may keep here what it would otherwise recompute every slot;
        keys are namespaced by module, e.g. ``"slot_table.links"``.
        """
        return {}

    @cached_property
    def workers(self) -> list[NodeInfo]:
        """Nodes that may host LMs, in manifest order."""
        return [n for n in self.nodes if n.spec.role == "worker"]

    @cached_property
    def lm_names(self) -> list[str]:
        return [s.name for s in self.services]

    @cached_property
    def request_classes(self) -> list[str]:
        """Every request class: each LM's own name, then each `serves` entry, first seen first."""
        out = dict.fromkeys(self.lm_names)
        for s in self.services:
            out.update(dict.fromkeys(s.spec.serves))
        return list(out)

    def is_request_class(self, name: str) -> bool:
        return name in self._models

    @cached_property
    def _models(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for c in self.request_classes:
            models = [s.name for s in self.services if s.serves_class(c)]
            out[c] = sorted(models, key=lambda m: m != c)  # stable: the LM itself first
        return out

    def models_for(self, request_class: str) -> list[str]:
        """LM services that serve `request_class`, in manifest order ([] if unknown).

        An LM name serves itself first; do not mutate the result (cached).
        """
        return self._models.get(request_class, [])

    def default_model(self, request_class: str) -> str | None:
        """The LM that serves a request class no route assigns a model to.

        The class itself when it is an LM, else the first model (manifest
        order) that some worker can host; None for an unknown class.
        """
        if self.has_service(request_class):
            return request_class
        return next((m for m in self.models_for(request_class) if self.feasible_nodes(m)), None)

    def modes(self, node: str, lm: str) -> tuple[Mode, ...]:
        """The modes `lm` can run in alone on `node`, fastest first; () when it cannot run there.

        The one hostability rule (`lmedge.api.hosting.modes`: role, memory,
        cores, GPU and vRAM, CPU with a CPU profile), kept per (node, LM):
        the MILP asks ~500,000 times a slot at 1,000 workers. An unknown name
        is a KeyError.
        """
        key = (node, lm)
        hit = self._modes.get(key)
        if hit is None:
            hit = self._modes[key] = hosting.modes(self.node(node).spec, self.service(lm).spec)
        return hit

    @cached_property
    def _modes(self) -> dict[tuple[str, str], tuple[Mode, ...]]:
        return {}

    def can_host(self, node: str, lm: str) -> bool:
        """Whether `lm` could run alone on `node` at all: `modes` is not empty."""
        self.node(node), self.service(lm)  # an unknown name is a KeyError, as it always was
        # a set lookup: routing-map validation asks once per route (~14,000 a slot at scale)
        return node in self._hosts[lm]

    @cached_property
    def _feasible(self) -> dict[str, list[str]]:
        return {
            s.name: [n.name for n in self.workers if self.modes(n.name, s.name)]
            for s in self.services
        }

    @cached_property
    def _hosts(self) -> dict[str, frozenset[str]]:
        return {lm: frozenset(nodes) for lm, nodes in self._feasible.items()}

    def feasible_nodes(self, lm: str) -> list[str]:
        """Workers that could host `lm`; routing weight may only go to these.

        Cached: the context is static for a run. Do not mutate the result.
        """
        return self._feasible[lm]

    def deadline_s(self, lm: str) -> float:
        return self.service(lm).spec.deadline_s or self.loop.tau_s


class InstanceState(WireModel):
    """A model instance (pod) on a node."""

    lm: str
    mode: Literal["gpu", "cpu"]
    cpu_cores: float = Field(ge=0)
    vgpus: int = Field(ge=0)
    status: Literal["pending", "ready"] = Field(
        description="pending: starting (cold start, pod not ready); ready: serving."
    )


class NodeState(WireModel):
    """One node at the end of the previous slot."""

    name: str
    backlog: dict[str, int] = Field(
        default_factory=dict, description="Q_ni: prompts waiting or in service per LM."
    )
    instances: list[InstanceState] = Field(default_factory=list)
    free_cpu_cores: float = 0.0
    free_memory_gib: float = 0.0
    free_vgpus: int = 0
    free_vram_gib: float = 0.0
    gpu_util: float = Field(default=0.0, ge=0, le=1)
    cpu_util: float = Field(default=0.0, ge=0, le=1)
    engines: list[EngineTelemetry] | None = Field(
        default=None,
        description="Token-engine pods (KV cache, batch, tokens/s); None without any.",
    )

    @property
    def pending(self) -> bool:
        """True while any instance on the node is still starting (the pending rule)."""
        return any(i.status == "pending" for i in self.instances)

    def instance(self, lm: str) -> InstanceState | None:
        return next((i for i in self.instances if i.lm == lm), None)


class Snapshot(WireModel):
    slot: int = Field(ge=0)
    time_s: float = Field(ge=0)
    nodes: list[NodeState]

    def node(self, name: str) -> NodeState:
        return next(n for n in self.nodes if n.name == name)


class Arrival(WireModel):
    """Requests of one LM arriving at one origin during the slot.

    `request` names one request when the world knows it before routing (the
    emulator, which submits one `Arrival` per request; a per-request router
    sees a window's request as one, `WindowRequest.id`). `input_tokens` is its prompt's
    length for a token-engine LM (the output length is not known until it
    ends). Both are None on an aggregate arrival (a gateway's count).
    """

    origin: str
    lm: str
    requests: int = Field(ge=0)
    prompts: int = Field(ge=0)
    request: str | None = Field(default=None, description="The request's id, when known.")
    input_tokens: int | None = Field(
        default=None, ge=0, description="Input tokens of its prompts (token-engine LMs)."
    )


class LMStats(WireModel):
    lm: str
    arrivals: int = Field(ge=0, description="Requests A_i.")
    successes: int = Field(ge=0, description="Successful requests S_i.")
    success_ratio: float | None = Field(description="rho_i; None when A_i = 0.")
    mean_latency_s: float | None = Field(description="Success-only mean latency.")
    rejected: int = Field(
        default=0, ge=0, description="Requests refused by admission control; part of A_i, failed."
    )


class EpochMetrics(WireModel):
    """The paper's metrics over one window (an epoch, usually)."""

    per_lm: list[LMStats]
    requests: int = Field(ge=0)
    successes: int = Field(ge=0)
    rejected: int = Field(default=0, ge=0, description="Refused at once; counted in requests.")
    mean_latency_s: float | None = Field(description="Request-weighted success-only mean.")
    lm_mean_latency_s: float | None = Field(
        default=None,
        description="Unweighted mean of the per-LM mean latencies (an LM with no success at "
        "its deadline); the paper's headline latency.",
    )
    jain: float | None
    f_norm: float | None
    t_norm: float | None
    objective: float | None
    off_role_ratio: float = Field(default=0.0, ge=0, le=1)
    conflict_ratio: float = Field(default=0.0, ge=0, le=1)


class MemoryCase(WireModel):
    """One epoch remembered by the planner: traffic mix, policy and outcome."""

    run: str = ""
    epoch: int = Field(ge=0)
    traffic: dict[str, int] = Field(description="Prompts per LM in the epoch.")
    policy: MacroPolicy
    metrics: EpochMetrics
    objective: float | None


class PlanningObservation(WireModel):
    """o^G_e = (C, H_e, M_{e-1}, Pi_{e-1}) plus the random-policy baseline."""

    epoch: int = Field(ge=0)
    context: ClusterContext
    baseline: EpochMetrics | None = None
    last: EpochMetrics | None = None
    previous: MacroPolicy | None = None
    memory: list[MemoryCase] = Field(default_factory=list)
    traffic: dict[str, int] = Field(
        default_factory=dict,
        description="Prompts per LM in the last epoch and, for a planner that reads traffic"
        " (Capabilities.reads_traffic), this one so far.",
    )


class SlotObservation(WireModel):
    """What the router sees at the start of slot t."""

    slot: int = Field(ge=0)
    epoch: int = Field(ge=0)
    context: ClusterContext
    macro: MacroPolicy | None
    snapshot: Snapshot
    arrivals: list[Arrival]


class WindowRequest(WireModel):
    """One request of a routing window (request-level routing): who asks what, how much."""

    id: str
    origin: str
    lm: str = Field(description="The request class (an LM name or a class LMs serve).")
    prompts: int = Field(ge=1)
    submit_s: float = Field(ge=0)
    input_tokens: int | None = Field(default=None, ge=0, description="None: not a token request.")
    output_tokens: int | None = Field(
        default=None, ge=0, description="Predicted output tokens (the emulator knows them)."
    )


class RequestWindow(WireModel):
    """The requests that arrived in one window [start_s, end_s) of a slot, to route one by one.

    A router declaring `Capabilities.routes_requests` answers it with one
    `Route` per request, in order (`RequestRouter.route_requests`).
    """

    slot: int = Field(ge=0)
    start_s: float = Field(ge=0)
    end_s: float = Field(ge=0)
    context: ClusterContext
    snapshot: Snapshot
    requests: list[WindowRequest]


class NodeObservation(WireModel):
    """What one node's deployer sees: its own node only."""

    slot: int = Field(ge=0)
    epoch: int = Field(ge=0)
    node: NodeInfo
    services: list[ServiceInfo]
    roles: list[str] = Field(description="LMs the planner intends this node to host.")
    modes: dict[str, PlannedMode] = Field(
        default_factory=dict,
        description=(
            "Mode (gpu or cpu) the plan sized each role LM for here (`NodeRole.modes`);"
            " a preference for the deployer, empty when the plan does not say."
        ),
    )
    state: NodeState
    previous: Placement | None = None
    tau_s: float = TAU_S
    slot_s: float = SLOT_S
