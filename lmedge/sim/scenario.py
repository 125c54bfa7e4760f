"""Scenarios: the cluster manifests plus the emulation and workload parameters.

A scenario is a folder holding `nodes.yaml` (EdgeNode), `services.yaml`
(LMService) -- the same YAML a user applies to a cluster -- and
`scenario.yaml` (`kind: Scenario`): the control-loop constants, the
emulator's physical parameters and the workload. Every parameter documents
its source: the paper, docs/design.md, or "assumption".

Loading validates everything up front and turns each problem into one
`ManifestError` naming the file and field, or an `InfeasibleScenarioError`
when an LM fits on no node. This module does not emulate anything.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import ConfigDict, Field, ValidationError, model_validator

from lmedge.api.base import K8sName, NonNegFloat, PosFloat, SpecModel
from lmedge.api.constants import LoopConstants
from lmedge.api.manifests import (
    API,
    as_the_api_server_reads,
    format_validation_error,
    load_resources,
    load_yaml,
)
from lmedge.api.observations import ClusterContext, NodeInfo, ServiceInfo
from lmedge.errors import InfeasibleScenarioError, ManifestError
from lmedge.sim.radio import UsersSpec
from lmedge.sim.timeline import Timeline, compile_timeline, read_timeline, static_timeline
from lmedge.sim.tokens.lengths import LognormalLengths, TokenLengthsSpec, read_length_trace
from lmedge.sim.trace import RequestSpec, read_trace

SCENARIO_FILE = "scenario.yaml"


class LoopSpec(LoopConstants):
    """The `loop:` section: the loop constants (camelCase, as in every manifest) and `slots`.

    It extends `LoopConstants` rather than containing it so that the section
    stays flat (`loop: {slotS: 30, tauS: 900, slots: 200}`), as scenario files
    have always read; `constants` is the plain value a `ClusterContext` holds.
    """

    model_config = SpecModel.model_config | ConfigDict(frozen=True)

    slots: int = Field(
        default=200,
        ge=1,
        description="Default run length when the caller gives none. Paper §VI: 200-slot segments.",
    )

    @property
    def constants(self) -> LoopConstants:
        """The loop constants alone (without `slots`), as a `LoopConstants`."""
        return LoopConstants.model_validate(
            self.model_dump(include=set(LoopConstants.model_fields))
        )


class ColdStartSpec(SpecModel):
    """Pod start + model load until the first inference (truncated lognormal)."""

    median_s: PosFloat = Field(default=9.34, description="Paper §V-D (80 measurements).")
    p95_s: PosFloat = Field(default=12.23, description="Paper §V-D.")
    max_s: PosFloat = Field(default=13.58, description="Paper §V-D; samples never exceed it.")

    @model_validator(mode="after")
    def _ordered(self) -> ColdStartSpec:
        if not self.median_s < self.p95_s < self.max_s:
            raise ValueError("need medianS < p95S < maxS")
        return self


class SlowdownSpec(SpecModel):
    """The utilization slowdown f(eta) = 1 / (1 + beta * max(0, eta - eta0)).

    The paper's mu_ni = alpha_i f(eta) (Eq. 13) omits f's form; this is the
    documented choice (docs/design.md "Emulator model choices"): no slowdown
    below the knee eta0, then a linear rise of the service time with slope beta.
    """

    eta0: float = Field(ge=0, le=1, description="Knee: utilization below which f = 1.")
    beta: NonNegFloat = Field(
        description="Service-time increase per unit of utilization above eta0."
    )


class EmulationSpec(SpecModel):
    """The emulator's physical model. Service times come from each LMService profile."""

    cold_start: ColdStartSpec = Field(default_factory=ColdStartSpec)
    cpu_parallel_fraction: float = Field(
        default=0.8,
        ge=0,
        le=1,
        description=(
            "Amdahl parallel fraction p of CPU inference: time(c) = cpuSecondsPerPrompt * "
            "S(defaultCpuCores) / S(c), S(c) = 1 / ((1 - p) + p / c). Assumption."
        ),
    )
    cpu_slowdown: SlowdownSpec = Field(
        default_factory=lambda: SlowdownSpec(eta0=0.7, beta=0.5),
        description="f(eta_cpu), eta_cpu = cores of busy CPU-mode pods / node cores. Assumption.",
    )
    memory_slowdown: SlowdownSpec = Field(
        default_factory=lambda: SlowdownSpec(eta0=0.8, beta=0.5),
        description="f(eta_mem), eta_mem = memory of resident pods / node memory. Assumption.",
    )
    gpu_slowdown: SlowdownSpec = Field(
        default_factory=lambda: SlowdownSpec(eta0=0.5, beta=0.2),
        description=(
            "f(eta_gpu), eta_gpu = vGPU slots of busy pods / slots of the GPU, counted only when "
            "two or more pods are busy on it (context-switch overhead). Assumption."
        ),
    )
    gpu_host_cores: NonNegFloat = Field(
        default=1.0,
        description="CPU cores a busy GPU-mode pod keeps busy (tokenizer, host code). Assumption.",
    )
    service_time_cv: NonNegFloat = Field(
        default=0.0,
        description=(
            "Coefficient of variation of per-prompt service time (lognormal, mean kept); "
            "0 = fixed. Assumption."
        ),
    )
    gpu_demand: dict[K8sName, float] = Field(
        default_factory=dict,
        description=(
            "Per-LM fraction (0, 1] of a GPU's time a busy pod uses when alone; LMs not "
            "named use 1 (full contention under time-slicing). A calibration knob. Assumption."
        ),
    )
    gpu_binding: Literal["spread", "pack"] = Field(
        default="spread",
        description=(
            "How a pod's vGPUs are bound to physical GPUs: spread (the GPU with the most free "
            "slots first) or pack (the fullest GPU that still has a free slot). Assumption."
        ),
    )


class PromptRange(SpecModel):
    """K ~ U{min..max} prompts per (origin, LM, slot); K = 0 means no request."""

    min: int = Field(default=0, ge=0)
    max: int = Field(default=8, ge=0, le=10_000)

    @model_validator(mode="after")
    def _ordered(self) -> PromptRange:
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) exceeds max ({self.max})")
        return self


class PhaseSpec(SpecModel):
    """A stretch of slots with its own per-LM prompt ranges (bursty traces)."""

    name: str = Field(min_length=1)
    slots: int = Field(ge=1, description="Length of the phase in slots.")
    prompts: dict[K8sName, PromptRange] = Field(
        default_factory=dict,
        description="Per-LM (or per request class) K ranges; those not named use workload.prompts.",
    )


class WorkloadSpec(SpecModel):
    """Arrivals: every worker (or the listed origins) is an origin; one request per LM per slot."""

    prompts: PromptRange = Field(
        default_factory=PromptRange,
        description="K ~ U{0..8} per (origin, LM, slot). Paper §V-B: K in {0, ..., 8}.",
    )
    arrival_spread: float = Field(
        default=1.0,
        ge=0,
        le=1,
        description=(
            "Arrival offsets within a slot are U[0, arrivalSpread * slotS); 0 = all at slot start. "
            "Assumption (the paper gives no intra-slot timing)."
        ),
    )
    phases: list[PhaseSpec] = Field(
        default_factory=list,
        description="Consecutive phases; after the last one ends it continues. Empty = one phase.",
    )
    origins: list[K8sName] | None = Field(
        default=None, description="Origin nodes; default: every worker (paper §V-B)."
    )
    origin_prompts: dict[K8sName, dict[K8sName, PromptRange]] = Field(
        default_factory=dict,
        description=(
            "Per-origin demand: {origin: {LM or request class: K range}}. A named cell "
            "(origin, class) draws its K from this range in every phase, instead of the "
            "phase's or workload.prompts' range; cells not named keep those. U{0..0} "
            "silences an origin for a class. Default: every origin alike (paper §V-B)."
        ),
    )
    classes: list[K8sName] | None = Field(
        default=None,
        description=(
            "Request classes the generator draws, in this order: LM names or classes an "
            "LMService `serves` (one request per class per origin and slot); default: every LM."
        ),
    )
    trace: str | None = Field(
        default=None,
        description="A recorded trace (CSV or JSONL: slot, origin, lm, prompts, offset_s) "
        "relative to the scenario folder; replaces the generator.",
    )
    token_lengths: TokenLengthsSpec = Field(
        default_factory=LognormalLengths,
        description=(
            "Input and output tokens of each prompt of a token-engine LM (llama.cpp, vllm): "
            "lognormal (LMSYS-Chat-1M means, lmedge/sim/tokens/README.md) or a trace file. "
            "Pipeline LMs ignore it."
        ),
    )
    lm_token_lengths: dict[K8sName, TokenLengthsSpec] = Field(
        default_factory=dict,
        description="Per LM (or request class) token lengths, overriding tokenLengths.",
    )
    users: UsersSpec | None = Field(
        default=None,
        description=(
            "Mobile users with a wireless uplink (lmedge/sim/radio.py) instead of per-node "
            "origins: each user sends one one-prompt request of a uniformly drawn class per "
            "slot (with probability `activity`); `prompts` and `phases` are then unused."
        ),
    )


class ScenarioMeta(SpecModel):
    name: K8sName


class ScenarioSpec(SpecModel):
    """The `scenario.yaml` document."""

    api_version: Literal["lmedge.io/v1alpha1"] = Field(alias="apiVersion")
    kind: Literal["Scenario"]
    metadata: ScenarioMeta
    description: str = ""
    nodes: str = Field(default="nodes.yaml", description="EdgeNode manifests, relative path.")
    services: str = Field(
        default="services.yaml", description="LMService manifests, relative path."
    )
    loop: LoopSpec = Field(default_factory=LoopSpec)
    emulation: EmulationSpec = Field(default_factory=EmulationSpec)
    workload: WorkloadSpec = Field(default_factory=WorkloadSpec)
    timeline: str | None = Field(
        default=None,
        description="Cluster events (kind: Timeline, see lmedge/sim/timeline.py) relative to "
        "the scenario folder: LMServices applied, edited or deleted, nodes down and back, "
        "links changed, each at a slot. Default: a cluster that never changes.",
    )


@dataclass(frozen=True)
class Scenario:
    """A loaded, validated scenario: manifests + parameters (+ the trace file, if any)."""

    name: str
    folder: Path
    spec: ScenarioSpec
    nodes: tuple[NodeInfo, ...]
    services: tuple[ServiceInfo, ...]
    trace: dict[int, list[RequestSpec]] | None = None
    #: The schedule of cluster changes; `nodes` / `services` are its slot-0 state.
    timeline: Timeline | None = None

    @property
    def schedule(self) -> Timeline:
        """The compiled timeline (one step, slot 0, when the scenario has none)."""
        return self.timeline or static_timeline(self.nodes, self.services)

    def context(self, slot: int = 0) -> ClusterContext:
        """The cluster in force during `slot`: nodes up, LMs in force, links as changed."""
        step = self.schedule.step_at(slot)
        return ClusterContext(
            nodes=step.nodes_up(), services=list(step.services), loop=self.spec.loop.constants
        )

    @property
    def trace_path(self) -> Path | None:
        t = self.spec.workload.trace
        return None if t is None else self.folder / t

    @property
    def request_classes(self) -> list[str]:
        """What the workload generates: `workload.classes`, or every LM in manifest order
        (then LMs the timeline adds, in the order they appear)."""
        c = self.spec.workload.classes
        return list(c) if c is not None else [s.name for s in self.schedule.all_services]

    @property
    def all_request_classes(self) -> list[str]:
        """Every request class some LM in force at some slot serves (LM names first)."""
        names: dict[str, None] = {}
        for step in self.schedule.steps:
            names.update(dict.fromkeys(s.name for s in step.services))
        for step in self.schedule.steps:
            for s in step.services:
                names.update(dict.fromkeys(s.spec.serves))
        return list(names)

    @property
    def origins(self) -> list[str]:
        w = self.spec.workload.origins
        return list(w) if w is not None else [n.name for n in self.nodes if n.spec.role == "worker"]


def load_scenario(path: Path, **overrides: Any) -> Scenario:
    """Load a scenario folder (or its `scenario.yaml`), validated.

    `overrides` are deep-merged into the scenario document before validation,
    with snake_case or camelCase keys, e.g.
    `load_scenario(p, loop={"tau_s": 60}, workload={"prompts": {"max": 2}})`.
    A folder without `scenario.yaml` gets every default.
    """
    path = Path(path)
    if not path.exists():
        raise ManifestError(str(path), "", "no such scenario folder or file")
    folder = path if path.is_dir() else path.parent
    file = folder / SCENARIO_FILE if path.is_dir() else path
    raw: dict[str, Any]
    if file.exists():
        # Read as strictly as the manifests: duplicate keys, `.inf`, quoted numbers
        # and snake_case names are errors, not silently taken.
        try:
            documents = load_yaml(file.read_text())
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f"line {mark.line + 1}" if mark else ""
            problem = getattr(exc, "problem", None) or str(exc)
            raise ManifestError(
                str(file), where, f"not valid YAML: {' '.join(problem.split())}"
            ) from exc
        documents = [d for d in documents if d is not None]
        if len(documents) != 1 or not isinstance(documents[0], dict):
            raise ManifestError(str(file), "", "must be one YAML mapping with kind: Scenario")
        raw = as_the_api_server_reads(documents[0], str(file), "Scenario.")
    else:
        raw = {"apiVersion": API, "kind": "Scenario", "metadata": {"name": _dns(folder.name)}}
    raw = _deep_merge(raw, _camel_keys(overrides))
    try:
        spec = ScenarioSpec.model_validate(raw, strict=True, by_alias=True, by_name=False)
    except ValidationError as exc:
        field, msg = format_validation_error(exc, "Scenario")
        raise ManifestError(str(file), field, msg) from exc
    nodes, services = _load_manifests(folder, spec)
    scenario = Scenario(
        name=spec.metadata.name,
        folder=folder,
        spec=spec,
        nodes=tuple(nodes),
        services=tuple(services),
    )
    if spec.timeline is not None:
        tl_path = folder / spec.timeline
        if not tl_path.is_file():
            raise ManifestError(str(file), "Scenario.timeline", f"no such file: {tl_path}")
        timeline = compile_timeline(read_timeline(tl_path), nodes, services, str(tl_path))
        scenario = dataclasses.replace(scenario, timeline=timeline)
    _check(scenario, str(file))
    trace = scenario.trace_path
    if trace is not None:
        lms = scenario.all_request_classes
        workers = {n.name for n in nodes if n.spec.role == "worker"}
        rows = read_trace(trace, workers, set(lms), spec.loop.slot_s)
        scenario = dataclasses.replace(scenario, trace=rows)
    return scenario


def _load_manifests(folder: Path, spec: ScenarioSpec) -> tuple[list[NodeInfo], list[ServiceInfo]]:
    nodes, _ = load_resources(folder / spec.nodes)
    _, services = load_resources(folder / spec.services)
    if not nodes:
        raise ManifestError(str(folder / spec.nodes), "EdgeNode", "no EdgeNode manifests found")
    if not services:
        raise ManifestError(
            str(folder / spec.services), "LMService", "no LMService manifests found"
        )
    return nodes, services


def _check(s: Scenario, source: str) -> None:
    ctx = s.context()
    if not ctx.workers:
        raise InfeasibleScenarioError(f"{s.folder / s.spec.nodes}: no worker nodes (role: worker)")
    for svc in s.services:
        if not ctx.feasible_nodes(svc.name):
            raise InfeasibleScenarioError(f"{s.folder / s.spec.services}: {_why_nowhere(svc)}")
    lm_names = {sv.name for sv in s.schedule.all_services}
    for lm, d in s.spec.emulation.gpu_demand.items():
        where = f"Scenario.emulation.gpuDemand.{lm}"
        if lm not in lm_names:
            raise ManifestError(source, where, "unknown LMService")
        if not 0 < d <= 1:
            raise ManifestError(source, where, f"must be in (0, 1], not {d:g}")
    classes = set(s.all_request_classes)
    for i, cls in enumerate(s.spec.workload.classes or []):
        if cls not in classes:
            raise ManifestError(
                source,
                f"Scenario.workload.classes.{i}",
                f"{cls!r} is neither an LMService nor a class one serves",
            )
    wanted = set(s.request_classes)
    for i, phase in enumerate(s.spec.workload.phases):
        for lm in phase.prompts:
            if lm not in lm_names and lm not in wanted:
                raise ManifestError(
                    source, f"Scenario.workload.phases.{i}.prompts.{lm}", "unknown LMService"
                )
    if s.spec.workload.origins is not None:
        for i, o in enumerate(s.spec.workload.origins):
            if not ctx.has_node(o) or ctx.node(o).spec.role != "worker":
                raise ManifestError(
                    source, f"Scenario.workload.origins.{i}", f"{o!r} is not a worker"
                )
    origins = set(s.origins)
    for o, per_class in s.spec.workload.origin_prompts.items():
        where = f"Scenario.workload.originPrompts.{o}"
        if o not in origins:
            raise ManifestError(source, where, f"{o!r} is not an origin of the workload")
        for cls in per_class:
            if cls not in lm_names and cls not in wanted:
                raise ManifestError(
                    source, f"{where}.{cls}", "neither an LMService nor a request class"
                )
    wl = s.spec.workload
    lengths = [("Scenario.workload.tokenLengths", wl.token_lengths)]
    for cls, spec in wl.lm_token_lengths.items():
        where = f"Scenario.workload.lmTokenLengths.{cls}"
        if cls not in lm_names and cls not in wanted:
            raise ManifestError(source, where, "neither an LMService nor a request class")
        lengths.append((where, spec))
    for where, spec in lengths:
        if spec.kind == "trace":
            if not (s.folder / spec.file).is_file():
                raise ManifestError(
                    source, f"{where}.file", f"no such file: {s.folder / spec.file}"
                )
            read_length_trace(s.folder / spec.file)
    if wl.users is not None and wl.trace is not None:
        raise ManifestError(
            source, "Scenario.workload.users", "a trace replaces the users: give one"
        )
    trace = s.trace_path
    if trace is not None and not trace.is_file():
        raise ManifestError(source, "Scenario.workload.trace", f"no such file: {trace}")
    _check_links(s)


def _why_nowhere(svc: ServiceInfo) -> str:
    sp = svc.spec
    where = "a GPU node with" if sp.runs_on == "gpu-only" else "a worker with"
    return (
        f"LMService {svc.name} fits on no node: it needs {where} "
        f"{sp.deployment_memory_gib:g} GiB memory"
        + (f" and {sp.min_vram_gib:g} GiB vRAM" if sp.runs_on == "gpu-only" else "")
    )


def _check_links(s: Scenario) -> None:
    """Every pair of worker sites must be joined by a link from one side or the other."""
    links: dict[str, set[str]] = {}
    for n in s.nodes:
        links.setdefault(n.spec.site, set()).update(lk.site for lk in n.spec.links)
    sites = sorted({n.spec.site for n in s.nodes if n.spec.role == "worker"})
    for i, a in enumerate(sites):
        for b in sites[i + 1 :]:
            if b not in links.get(a, set()) and a not in links.get(b, set()):
                node = next(n.name for n in s.nodes if n.spec.site == a)
                raise ManifestError(
                    str(s.folder / s.spec.nodes),
                    f"EdgeNode/{node}.spec.links",
                    f"no link between sites {a!r} and {b!r}",
                )


def _dns(name: str) -> str:
    out = "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-")
    return out or "scenario"


def _camel(key: str) -> str:
    if "_" not in key:
        return key
    head, *rest = key.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


def _camel_keys(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {_camel(str(k)): _camel_keys(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_camel_keys(v) for v in value]
    return value


def _deep_merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in extra.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), dict):
            out[k] = _deep_merge(out[k], v)
        else:
            out[k] = v
    return out
