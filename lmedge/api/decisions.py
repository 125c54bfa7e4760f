"""What the three agents decide, and the audit envelope around every decision.

The decision models use lists of small objects rather than maps keyed by
node or LM name: strict JSON-Schema structured output (OpenAI `strict: true`)
cannot express open-keyed maps, and the same schema is what the LLM sees.
Shape is checked here; feasibility (sums, capacities, GPU-only) is checked in
`lmedge.api.feasibility`, which reports every violation at once.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any, Final, Generic, Literal, TypeVar

from pydantic import ConfigDict, Field, field_validator, model_validator

from lmedge.api.base import WireModel

Mode = Literal["gpu", "cpu", "off"]
#: The mode a plan sizes an LM for on a node (an LM the plan hosts is never off).
PlannedMode = Literal["gpu", "cpu"]
#: JSON-Schema keyword marking a field only deterministic code fills: `strict_json_schema`
#: leaves it out, so no LLM is asked for it (a reply without it validates: it has a default).
RULE_ONLY: Final = "x-rule-only"
AgentKind = Literal["planner", "scheduler", "deployer"]
#: `llm`: an LLM produced it; `rule`: a deterministic plugin; `fallback`: a replacement.
Source = Literal["llm", "rule", "fallback"]
Outcome = Literal["accepted", "replaced"]


class RouteWeight(WireModel):
    node: str = Field(description="Destination node name.")
    p: float = Field(ge=0, le=1, description="Share of this LM's traffic sent to the node.")


class LMRouting(WireModel):
    lm: str = Field(description="LM service name.")
    weights: list[RouteWeight] = Field(description="Weights over feasible nodes, summing to 1.")


class NodeRole(WireModel):
    """The LMs a node is expected to host, and the mode the plan sized each for.

    `modes` is a map, unlike the lists above, because no LLM is asked for it
    (`RULE_ONLY`): the rule planner fills it from its capacity units, so the
    rule deployer can start each LM in the mode the routing weights assumed.
    It is a preference, never a constraint, and empty when the plan does not
    say (an LLM's roles); an empty map is left out of the JSON, so a policy
    without modes is stored and exchanged exactly as before.
    """

    node: str = Field(description="Worker node name.")
    lms: list[str] = Field(description="LM services this node is expected to host.")
    modes: dict[str, PlannedMode] = Field(
        default_factory=dict,
        exclude_if=lambda v: not v,
        description="Planned mode (gpu or cpu) of each LM in `lms` the plan sized; may be empty.",
        json_schema_extra={RULE_ONLY: True},
    )


class MacroPolicy(WireModel):
    """Tier-1 output, once per epoch: routing probabilities per LM + node role intent."""

    routing: list[LMRouting]
    roles: list[NodeRole]
    rationale: str = Field(default="", description="One or two sentences on why.")

    def weights(self) -> dict[str, dict[str, float]]:
        """Routing probabilities as {lm: {node: p}}."""
        return {r.lm: {w.node: w.p for w in r.weights} for r in self.routing}

    def role_map(self) -> dict[str, list[str]]:
        """Node role intent as {node: [lm, ...]}."""
        return {r.node: list(r.lms) for r in self.roles}

    def mode_map(self) -> dict[str, dict[str, PlannedMode]]:
        """Planned modes as {node: {lm: mode}}, for the role LMs the plan gave one."""
        return {r.node: {lm: m for lm, m in r.modes.items() if lm in r.lms} for r in self.roles}


class Route(WireModel):
    origin: str = Field(description="Node where the requests arrived.")
    lm: str = Field(description="LM service (request class) of the requests.")
    destination: str = Field(description="Node that will serve them.")
    model: str | None = Field(
        default=None,
        description=(
            "LM service that serves the requests when `lm` is a request class several LMs "
            "serve; null means `lm` itself."
        ),
    )

    @property
    def serving_lm(self) -> str:
        """The LM service that serves this route's requests."""
        return self.model if self.model is not None else self.lm


class Rejection(WireModel):
    """An (origin, LM) pair whose requests this slot are refused at once (admission control)."""

    origin: str = Field(description="Node where the requests arrive.")
    lm: str = Field(description="LM service (request class) of the requests to refuse.")


class RoutingMap(WireModel):
    """Tier-2 router output, every slot: (origin, LM or request class) -> destination (+ model).

    `rejections` lists the pairs the router refuses this slot instead of
    routing them: their requests get an immediate `rejected` record (the
    gateway answers 429), which counts as a failure in every metric. A pair
    is routed or rejected, never both. A separate list, not a nullable
    `Route.destination`, so every consumer that only routes keeps a
    destination per route, and strict JSON Schema can still express it (an
    empty list when nothing is refused). Only routers with admission control
    turned on reject; fallback routing never does.
    """

    routes: list[Route]
    rejections: list[Rejection] = Field(
        default_factory=list,
        description="(origin, LM) pairs refused this slot; empty unless admission control is on.",
    )

    def lookup(self) -> dict[tuple[str, str], str]:
        return {(r.origin, r.lm): r.destination for r in self.routes}

    def rejected(self) -> set[tuple[str, str]]:
        """The refused (origin, LM) pairs."""
        return {(r.origin, r.lm) for r in self.rejections}


class LMPlacement(WireModel):
    """One LM's share of a node in a `Placement`; immutable, so one value can be shared."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    lm: str = Field(description="LM service name.")
    mode: Mode = Field(description="gpu, cpu or off.")
    cpu_cores: float = Field(ge=0, description="CPU cores (requests = limits); 0 when off.")
    vgpus: int = Field(ge=0, description="vGPUs (nvidia.com/gpu); 0 unless mode is gpu.")


class Placement(WireModel):
    """Tier-2 deployer output for one node, every slot."""

    node: str
    lms: list[LMPlacement]

    def by_lm(self) -> dict[str, LMPlacement]:
        return {p.lm: p for p in self.lms}

    def active(self) -> dict[str, LMPlacement]:
        return {p.lm: p for p in self.lms if p.mode != "off"}


T = TypeVar("T", MacroPolicy, RoutingMap, Placement)

#: Bounds on what an LLM reply puts into a `Decision`, so a bogus or hostile
#: reply cannot make the audit record unstorable (BSON integers are 64-bit, a
#: document at most 16 MiB) or bloat the store. A real reply is far inside all.
#: Token counts above this are clamped to it (2^31 - 1: no context is that long).
MAX_TOKENS: Final = 2**31 - 1
#: Characters of the raw reply kept; `raw_chars` keeps the full length.
MAX_RAW_CHARS: Final = 32_768
#: Characters kept of `error`, of each violation, and of `model`.
MAX_TEXT_CHARS: Final = 2_000
#: Violations kept; past it the last one says how many were left out.
MAX_VIOLATIONS: Final = 100


def _utcnow() -> datetime:
    return datetime.now(UTC)


class GuardScore(WireModel):
    """One candidate the scoring guard weighed: who proposed it and its estimated objective."""

    source: Literal["llm", "rule"]
    objective: float = Field(description="Estimated objective J of executing it (lower is better).")


class GuardAudit(WireModel):
    """How the scoring guard chose between an LLM proposal and the rule's decision.

    The LLM's value runs only when its estimate is at most `margin` above the
    rule's; `chosen` says which ran and `reason` why, in words.
    """

    margin: float = Field(ge=0, description="Allowed excess of the LLM's estimate over the rule's.")
    candidates: list[GuardScore] = Field(description="The LLM's and the rule's estimates.")
    chosen: Literal["llm", "rule"]
    reason: str = ""


class RoutedRequest(WireModel):
    """Where a routing window sent one request (request-level routing's audit)."""

    request: str = Field(description="The request's id (`RequestRecord.id`).")
    destination: str = Field(description="Node that serves it.")
    model: str | None = Field(
        default=None, description="LM service that serves it when it names a class; null: its LM."
    )


#: The `Decision.trigger` of a gateway's routing window: stored with the scheduler's
#: slot maps, told apart by it (and by its `node`, the gateway's).
WINDOW_TRIGGER: Final = "window"


class WindowAudit(WireModel):
    """What one routing window at a gateway decided (request-level routing).

    `routes` holds one entry per request, by id, in arrival order. `j` and
    the raw terms are the router's own report of the window (CEMA: J, mean
    quality loss, cost, modelled energy, makespan, and `seed_j` the
    load-aware seed's J on the same window); None when the router reports
    none or the window did not go by it. `used` says who routed the window:
    the router, the load-aware `seed`, or the slot's `map`; the decision's
    `error` says why when it was not the router.
    """

    start_s: float = Field(ge=0, description="Run clock when the window opened, seconds.")
    end_s: float = Field(ge=0, description="Run clock when it closed, seconds.")
    requests: int = Field(ge=0)
    used: Literal["router", "seed", "map"]
    wait_s: float = Field(ge=0, description="Close to decision, seconds (wall).")
    routes: list[RoutedRequest] = Field(default_factory=list)
    j: float | None = None
    seed_j: float | None = None
    quality_loss: float | None = None
    cost: float | None = None
    energy: float | None = None
    makespan: float | None = None


class Decision(WireModel, Generic[T]):
    """The audit envelope: a decided value plus how it came to be.

    Plugins fill `value`, `source`, `policy` and, for LLM agents, `raw`,
    `parsed`, `validated`, `violations`, `tokens_*`, `model` and `guard` (the
    scoring guard's comparison with the rule). The controller (the runner, not
    the plugin) stamps `run`, `epoch`, `slot`, `latency_s`, `sim_time_s` and
    `trigger`, validates, and when it replaces the value sets
    `outcome="replaced"` and keeps the violations that caused it.

    What an LLM reply brings in is bounded here, once, for every agent: token
    counts are clamped to [0, `MAX_TOKENS`], `raw` keeps its first
    `MAX_RAW_CHARS` characters (`raw_chars` the full length), `error`, `model`
    and each violation at most `MAX_TEXT_CHARS`, and at most `MAX_VIOLATIONS`
    violations. A clamped number or a cut text is still visibly what it was.
    """

    agent: AgentKind
    policy: str = Field(description="Plugin that produced the value, e.g. agentic-router.")
    source: Source
    value: T
    run: str = ""
    epoch: int = Field(default=0, ge=0)
    slot: int = Field(default=0, ge=0)
    node: str | None = None
    raw: str | None = Field(
        default=None,
        description=f"Raw LLM output, verbatim up to its first {MAX_RAW_CHARS} characters.",
    )
    raw_chars: int | None = Field(
        default=None, ge=0, description="Length of the raw LLM output in characters."
    )
    parsed: bool = True
    validated: bool = True
    outcome: Outcome = "accepted"
    violations: list[str] = Field(default_factory=list)
    error: str | None = Field(default=None, description="Why a call failed, if it did.")
    latency_s: float = Field(default=0.0, ge=0, description="Wall time to decide.")
    tokens_in: int = Field(default=0, ge=0)
    tokens_out: int = Field(default=0, ge=0)
    model: str | None = None
    sim_time_s: float = Field(default=0.0, ge=0, description="Run clock at decision time.")
    trigger: str | None = Field(
        default=None,
        description="Why a decision was made off its schedule, e.g. a re-plan after a "
        "cluster change ('lm_added lm5; node_down worker-2: Node NotReady').",
    )
    guard: GuardAudit | None = Field(
        default=None,
        description="The scoring guard's comparison with the rule, when one was made.",
    )
    window: WindowAudit | None = Field(
        default=None, description="A gateway's routing window: its terms and who routed it."
    )
    created_at: datetime = Field(default_factory=_utcnow)

    @field_validator("tokens_in", "tokens_out", mode="before")
    @classmethod
    def _clamp_tokens(cls, value: Any) -> Any:
        if isinstance(value, bool):
            return value  # left to the int check, which refuses it
        if isinstance(value, float) and math.isfinite(value):
            value = int(value)
        if isinstance(value, int):
            return min(max(value, 0), MAX_TOKENS)
        return value

    @field_validator("error", "model", mode="before")
    @classmethod
    def _cap_text(cls, value: Any) -> Any:
        return _cap(value, MAX_TEXT_CHARS)

    @field_validator("violations", mode="before")
    @classmethod
    def _cap_violations(cls, value: Any) -> Any:
        return cap_violations(value) if isinstance(value, list) else value

    @model_validator(mode="before")
    @classmethod
    def _cap_raw(cls, data: Any) -> Any:
        if isinstance(data, dict):
            raw = data.get("raw")
            if isinstance(raw, str) and (len(raw) > MAX_RAW_CHARS or data.get("raw_chars") is None):
                data = {**data, "raw": raw[:MAX_RAW_CHARS], "raw_chars": len(raw)}
        return data


def cap_violations(violations: list[Any]) -> list[Any]:
    """At most `MAX_VIOLATIONS` violations of at most `MAX_TEXT_CHARS` each.

    For code that extends `Decision.violations` with `model_copy(update=...)`,
    which does not validate: the same bound as a validated `Decision`.
    """
    kept = [_cap(v, MAX_TEXT_CHARS) for v in violations[:MAX_VIOLATIONS]]
    if len(violations) > MAX_VIOLATIONS:
        kept[-1] = f"... and {len(violations) - MAX_VIOLATIONS + 1} more violations"
    return kept


def cap_text(text: str) -> str:
    """`text` cut to `MAX_TEXT_CHARS` (the bound of `Decision.error`)."""
    return str(_cap(text, MAX_TEXT_CHARS))


def _cap(value: Any, limit: int) -> Any:
    """A string cut to `limit` characters, marked as cut; anything else as it is."""
    if isinstance(value, str) and len(value) > limit:
        return value[: limit - 1] + "…"
    return value
