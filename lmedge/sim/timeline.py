"""A scenario's timeline of cluster events: what changes, at which slot.

`timeline.yaml` (named by `scenario.yaml`'s `timeline`) is one document,
`kind: Timeline`, listing events that take effect at a slot boundary:

```yaml
apiVersion: lmedge.io/v1alpha1
kind: Timeline
metadata: {name: churn}
events:
  - slot: 40
    apply: {apiVersion: lmedge.io/v1alpha1, kind: LMService, metadata: {name: lm5}, spec: {...}}
  - slot: 60
    delete: {kind: LMService, name: lm2}
  - slot: 50
    nodeDown: {node: worker-3, untilSlot: 80, reason: power cut}
  - slot: 90
    link: {sites: [uob, wtc], latencyMs: 25, bandwidthMbps: 100}
```

- `apply`: an LMService manifest, validated exactly as `services.yaml` is:
  created if no LMService of that name is in force, else an edit (pods of an
  edited LM are replaced, as a node agent would).
- `delete`: an LMService (its requests still queued or in service end
  `lm_removed`, its pods stop) or an EdgeNode (gone for good: `node_removed`).
- `nodeDown` / `nodeUp`: a worker lost (NotReady, drained) and back, with no
  pods; `untilSlot` is shorthand for a `nodeUp` at that slot.
- `link`: a site pair's latency and/or bandwidth, both directions.

`compile_timeline` replays the events statically, checking each against the
state it finds (deleting what is not there, a node down twice, an LM that
fits on no worker) so that every mistake is one `ManifestError` at load time;
what it returns is the schedule of contexts the emulator steps through.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, model_validator

from lmedge.api.base import K8sName, NonNegFloat, PosFloat, SpecModel
from lmedge.api.live import ContextChange
from lmedge.api.manifests import (
    as_the_api_server_reads,
    format_validation_error,
    load_yaml,
    parse_resources,
)
from lmedge.api.observations import ClusterContext, NodeInfo, ServiceInfo
from lmedge.api.resources import SiteLink
from lmedge.errors import ManifestError


class DeleteSpec(SpecModel):
    """`kubectl delete <kind> <name>`."""

    kind: Literal["LMService", "EdgeNode"]
    name: K8sName


class NodeDownSpec(SpecModel):
    """A worker lost (NotReady, cordoned and drained, powered off)."""

    node: K8sName
    until_slot: int | None = Field(
        default=None, ge=1, description="Slot at which the node is back (a nodeUp); default never."
    )
    reason: str = Field(default="node down", max_length=200)


class NodeUpSpec(SpecModel):
    """A lost worker back, empty (no pods)."""

    node: K8sName


class LinkSpec(SpecModel):
    """New figures for the path between two sites, both directions."""

    sites: list[K8sName] = Field(min_length=2, max_length=2)
    latency_ms: NonNegFloat | None = None
    bandwidth_mbps: PosFloat | None = None

    @model_validator(mode="after")
    def _something(self) -> LinkSpec:
        if self.sites[0] == self.sites[1]:
            raise ValueError("a link joins two different sites")
        if self.latency_ms is None and self.bandwidth_mbps is None:
            raise ValueError("give latencyMs, bandwidthMbps or both")
        return self


class EventSpec(SpecModel):
    """One event: a slot and exactly one action."""

    slot: int = Field(
        ge=1, description="The slot at whose start it takes effect (slot 0 is the manifests)."
    )
    apply: dict[str, Any] | None = Field(default=None, description="An LMService manifest.")
    delete: DeleteSpec | None = None
    node_down: NodeDownSpec | None = None
    node_up: NodeUpSpec | None = None
    link: LinkSpec | None = None

    @model_validator(mode="after")
    def _one_action(self) -> EventSpec:
        given = [wire for k, wire in ACTIONS.items() if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(
                "each event needs exactly one of apply, delete, nodeDown, nodeUp, link"
                + (f" (got {', '.join(given)})" if given else "")
            )
        return self


#: Field name -> wire name of each action.
ACTIONS = {
    "apply": "apply",
    "delete": "delete",
    "node_down": "nodeDown",
    "node_up": "nodeUp",
    "link": "link",
}


class TimelineMeta(SpecModel):
    name: K8sName


class TimelineSpec(SpecModel):
    """The `timeline.yaml` document."""

    api_version: Literal["lmedge.io/v1alpha1"] = Field(alias="apiVersion")
    kind: Literal["Timeline"]
    metadata: TimelineMeta
    events: list[EventSpec] = Field(default_factory=list, max_length=10_000)


@dataclass(frozen=True)
class Step:
    """The cluster from `slot` on: every node (links as changed), the LMs in force,
    the nodes down or removed, and the changes that led here."""

    slot: int
    nodes: tuple[NodeInfo, ...]
    services: tuple[ServiceInfo, ...]
    down: frozenset[str]
    changes: tuple[ContextChange, ...]

    def nodes_up(self) -> list[NodeInfo]:
        return [n for n in self.nodes if n.name not in self.down]


@dataclass(frozen=True)
class Timeline:
    """The compiled schedule: `steps[0]` is slot 0 (the manifests), then one step per event slot."""

    steps: tuple[Step, ...]

    @property
    def all_services(self) -> list[ServiceInfo]:
        """Every LMService that is ever in force (its latest spec), first seen first."""
        out: dict[str, ServiceInfo] = {}
        for st in self.steps:
            for s in st.services:
                out.setdefault(s.name, s)
        return list(out.values())

    def step_at(self, slot: int) -> Step:
        """The step in force during `slot`."""
        i = bisect.bisect_right([s.slot for s in self.steps], slot) - 1
        return self.steps[max(i, 0)]

    @property
    def changes(self) -> bool:
        return len(self.steps) > 1


def static_timeline(nodes: Sequence[NodeInfo], services: Sequence[ServiceInfo]) -> Timeline:
    """A cluster that never changes."""
    return Timeline((Step(0, tuple(nodes), tuple(services), frozenset(), ()),))


def read_timeline(path: Path) -> TimelineSpec:
    """Parse and validate `timeline.yaml` (one `ManifestError` per mistake)."""
    source = str(path)
    if not path.is_file():
        raise ManifestError(source, "", "no such timeline file")
    try:
        documents = load_yaml(path.read_text())
    except UnicodeDecodeError as exc:
        raise ManifestError(source, "", f"not UTF-8 text: {exc.reason}") from exc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ManifestError(source, where, f"not valid YAML: {' '.join(problem.split())}") from exc
    documents = [d for d in documents if d is not None]
    if len(documents) != 1 or not isinstance(documents[0], dict):
        raise ManifestError(source, "", "must be one YAML mapping with kind: Timeline")
    raw = as_the_api_server_reads(documents[0], source, "Timeline.")
    try:
        return TimelineSpec.model_validate(raw, strict=True, by_alias=True, by_name=False)
    except ValidationError as exc:
        field, msg = format_validation_error(exc, "Timeline")
        raise ManifestError(source, field, msg) from exc


def compile_timeline(
    spec: TimelineSpec,
    nodes: Sequence[NodeInfo],
    services: Sequence[ServiceInfo],
    source: str,
) -> Timeline:
    """Replay the events in slot order (file order within a slot), checking each."""
    node_names = {n.name: n for n in nodes}
    sites = {n.spec.site for n in nodes}
    cur_nodes = list(nodes)
    cur_services: dict[str, ServiceInfo] = {s.name: s for s in services}
    down: set[str] = set()
    removed: set[str] = set()
    steps = [Step(0, tuple(nodes), tuple(services), frozenset(), ())]
    # an untilSlot is a nodeUp event of its own, after the events written for that slot
    events: list[tuple[int, int, str, EventSpec | str]] = []
    for i, written in enumerate(spec.events):
        events.append((written.slot, 0, f"Timeline.events.{i}", written))
        nd = written.node_down
        if nd is not None and nd.until_slot is not None:
            if nd.until_slot <= written.slot:
                raise ManifestError(
                    source,
                    f"Timeline.events.{i}.nodeDown.untilSlot",
                    f"must be after the event's slot {written.slot}, not {nd.until_slot}",
                )
            events.append((nd.until_slot, 1, f"Timeline.events.{i}.nodeDown.untilSlot", nd.node))
    events.sort(key=lambda e: (e[0], e[1]))
    for slot, _, where, item in events:
        changes: list[ContextChange] = []
        if isinstance(item, str):
            changes.append(_node_up(item, down, removed, source, where))
        elif (ev := item).apply is not None:
            svc = _parse_service(ev.apply, source, f"{where}.apply")
            known = svc.name in cur_services
            if known and cur_services[svc.name].spec == svc.spec:
                raise ManifestError(
                    source, f"{where}.apply", f"LMService {svc.name} is unchanged at slot {slot}"
                )
            _check_fits(svc, cur_nodes, source, f"{where}.apply")
            cur_services[svc.name] = svc
            changes.append(
                ContextChange(
                    kind="lm_edited" if known else "lm_added",
                    name=svc.name,
                    detail="LMService edited" if known else "LMService applied",
                )
            )
        elif ev.delete is not None:
            d = ev.delete
            if d.kind == "LMService":
                if d.name not in cur_services:
                    raise ManifestError(
                        source, f"{where}.delete.name", f"no LMService {d.name} at slot {slot}"
                    )
                del cur_services[d.name]
                changes.append(ContextChange(kind="lm_removed", name=d.name, detail="deleted"))
            else:
                _check_worker(d.name, node_names, removed, source, f"{where}.delete.name")
                removed.add(d.name)
                down.add(d.name)
                changes.append(
                    ContextChange(kind="node_removed", name=d.name, detail="EdgeNode deleted")
                )
        elif ev.node_down is not None:
            nd = ev.node_down
            _check_worker(nd.node, node_names, removed, source, f"{where}.nodeDown.node")
            if nd.node in down:
                raise ManifestError(
                    source, f"{where}.nodeDown.node", f"{nd.node} is already down at slot {slot}"
                )
            down.add(nd.node)
            changes.append(ContextChange(kind="node_down", name=nd.node, detail=nd.reason))
        elif ev.node_up is not None:
            changes.append(_node_up(ev.node_up.node, down, removed, source, f"{where}.nodeUp.node"))
        elif ev.link is not None:
            lk = ev.link
            for j, site in enumerate(lk.sites):
                if site not in sites:
                    raise ManifestError(source, f"{where}.link.sites.{j}", f"no site {site!r}")
            cur_nodes = _with_link(cur_nodes, lk)
            a, b = lk.sites
            changes.append(ContextChange(kind="link_changed", name=f"{a}->{b}", detail=_said(lk)))
        if not any(n.spec.role == "worker" and n.name not in down for n in cur_nodes):
            raise ManifestError(source, where, f"no worker is left up at slot {slot}")
        last = steps[-1]
        step = Step(slot, tuple(cur_nodes), tuple(cur_services.values()), frozenset(down), ())
        if last.slot == slot:
            steps[-1] = Step(slot, step.nodes, step.services, step.down, (*last.changes, *changes))
        else:
            steps.append(Step(slot, step.nodes, step.services, step.down, tuple(changes)))
    return Timeline(tuple(steps))


def _node_up(
    node: str, down: set[str], removed: set[str], source: str, where: str
) -> ContextChange:
    if node in removed:
        raise ManifestError(source, where, f"{node} was deleted; it cannot come back")
    if node not in down:
        raise ManifestError(source, where, f"{node} is not down")
    down.discard(node)
    return ContextChange(kind="node_up", name=node, detail="node back, no pods")


def _check_worker(
    node: str, nodes: dict[str, NodeInfo], removed: set[str], source: str, where: str
) -> None:
    if node not in nodes:
        raise ManifestError(source, where, f"no EdgeNode {node}")
    if nodes[node].spec.role != "worker":
        raise ManifestError(source, where, f"{node} is not a worker")
    if node in removed:
        raise ManifestError(source, where, f"{node} was deleted already")


def _parse_service(manifest: dict[str, Any], source: str, where: str) -> ServiceInfo:
    if manifest.get("kind") == "EdgeNode":
        raise ManifestError(
            source,
            f"{where}.kind",
            "apply takes an LMService; nodes change by nodeDown/nodeUp/link",
        )
    try:
        nodes, services = parse_resources([(source, manifest)])
    except ManifestError as exc:
        # name the event rather than "document 1" of the timeline file
        field = exc.field.removeprefix("document 1: ")
        raise ManifestError(source, f"{where}.{field}", exc.message) from exc
    if nodes or len(services) != 1:
        raise ManifestError(source, f"{where}.kind", "apply takes one LMService manifest")
    return services[0]


def _check_fits(svc: ServiceInfo, nodes: Sequence[NodeInfo], source: str, where: str) -> None:
    # the same feasibility rule as loading a scenario
    ctx = ClusterContext(nodes=list(nodes), services=[svc])
    if not ctx.feasible_nodes(svc.name):
        raise ManifestError(source, where, f"LMService {svc.name} fits on no worker")


def _with_link(nodes: Sequence[NodeInfo], lk: LinkSpec) -> list[NodeInfo]:
    """Every node of either site gets the new figures for the other (an entry added if missing)."""
    a, b = lk.sites
    out: list[NodeInfo] = []
    for n in nodes:
        other = b if n.spec.site == a else a if n.spec.site == b else None
        if other is None:
            out.append(n)
            continue
        links = list(n.spec.links)
        old = next((x for x in links if x.site == other), None)
        base = old if old is not None else _any_link(nodes, n.spec.site, other)
        new = SiteLink(
            site=other,
            latency_ms=lk.latency_ms if lk.latency_ms is not None else base.latency_ms,
            bandwidth_mbps=lk.bandwidth_mbps
            if lk.bandwidth_mbps is not None
            else base.bandwidth_mbps,
        )
        links = [new if x.site == other else x for x in links] if old else [*links, new]
        out.append(n.model_copy(update={"spec": n.spec.model_copy(update={"links": links})}))
    return out


def _any_link(nodes: Sequence[NodeInfo], a: str, b: str) -> SiteLink:
    for n in nodes:
        for lk in n.spec.links:
            if (n.spec.site, lk.site) in ((a, b), (b, a)):
                return lk
    # a pair the scenario never joined cannot be loaded (scenario._check_links)
    raise KeyError(f"no link between sites {a!r} and {b!r}")


def _said(lk: LinkSpec) -> str:
    parts = []
    if lk.latency_ms is not None:
        parts.append(f"latency {lk.latency_ms:g} ms")
    if lk.bandwidth_mbps is not None:
        parts.append(f"bandwidth {lk.bandwidth_mbps:g} Mbit/s")
    return ", ".join(parts)
