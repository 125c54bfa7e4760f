"""The live cluster context of the Kubernetes backend: a watch cache of
LMServices, EdgeNodes and core Nodes.

`LiveCluster` implements `lmedge.api.live.LiveContext`: `update(slot)` returns
the context in force from that slot on and what changed since the last call.
Three background threads, one per resource, keep an in-memory copy of the
objects with the kubernetes client's list+watch: list (taking the list's
`resourceVersion`), watch from there, and relist whenever the watch breaks or
the server answers 410 Gone (the version is too old). A relist replaces the
whole copy, so a deletion missed while disconnected is still seen. `update`
reads only that copy: no API round trip at a slot boundary, and none at all
when nothing changed.

Why a client watch and not kopf's handlers: the controller runs kopf beside
its loop (`lmedge.processes.controller`), but the node agents do not run kopf,
and both must see the same changes at the same slot boundary. The client's
watch is the one mechanism both processes can use, so both use it; kopf keeps
its own watches for the operator's reconcile and status.

What counts as a change (`ContextChange`):

- an LMService created, its spec edited, or deleted (or being deleted):
  `lm_added`, `lm_edited` (detail: the spec fields that changed),
  `lm_removed`;
- an EdgeNode likewise: `node_added`, `node_edited`, `node_removed`;
- a worker going down or coming back: `node_down` / `node_up`. Down means
  its Node is NotReady (Ready False or Unknown), cordoned
  (`spec.unschedulable`; `kubectl drain` cordons first), or missing. A down
  node stays in no context: routing, planning and deployment leave it out
  from the slot the change is seen.

Status updates (the operator's, the kubelet's heartbeats) are not changes:
each object is reduced to what the context depends on before it is compared.
An EdgeNode or LMService whose spec does not validate is left out, as if
absent (the operator reports it in the object's status).

Nodes need `list`/`watch` on `nodes`; where RBAC refuses that, Node health is
not followed (logged once) and only EdgeNodes decide which workers exist.
`watch=False` is a polling mode for tests and debugging: `update` re-lists
EdgeNodes and LMServices on every call, and Nodes are not followed.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import urllib3
from kubernetes import watch
from kubernetes.client.exceptions import ApiException
from pydantic import BaseModel, ValidationError

from lmedge.api import (
    ClusterContext,
    EdgeNodeSpec,
    LMServiceSpec,
    LoopConstants,
    NodeInfo,
    ServiceInfo,
)
from lmedge.api.live import ContextChange, ContextUpdate
from lmedge.backends.kubernetes.client import GROUP, VERSION, ClusterRefused, KubeClient
from lmedge.errors import LmedgeError

__all__ = [
    "ClusterView",
    "LiveCluster",
    "context_of",
    "diff_views",
    "node_down_reason",
    "view_of",
]

log = logging.getLogger(__name__)

Resource = Literal["edgenodes", "lmservices", "nodes"]
RESOURCES: tuple[Resource, ...] = ("edgenodes", "lmservices", "nodes")

#: Server-side length of one watch request; the server ends it cleanly and the
#: thread watches again from the last version seen. Seconds.
WATCH_S = 240
#: Delay before a relist after a failed watch, doubling up to the max. Seconds.
BACKOFF_S, MAX_BACKOFF_S = 0.5, 10.0


@dataclass(frozen=True)
class ClusterView:
    """What the context is built from: valid specs, owner uids and down workers.

    `down` maps a worker EdgeNode to why it is down (its Node's state); it
    is empty where Node health is not followed.
    """

    edge_nodes: dict[str, EdgeNodeSpec] = field(default_factory=dict)
    services: dict[str, LMServiceSpec] = field(default_factory=dict)
    uids: dict[str, str] = field(default_factory=dict)
    down: dict[str, str] = field(default_factory=dict)


def node_down_reason(node: Mapping[str, Any] | None) -> str | None:
    """Why a worker with this Node object cannot serve, or None when it can.

    None for `node` means there is no Node of that name.
    """
    if node is None:
        return "no Node of that name"
    if (node.get("spec") or {}).get("unschedulable"):
        return "Node cordoned (spec.unschedulable)"
    conditions = (node.get("status") or {}).get("conditions") or []
    ready = next((c for c in conditions if c.get("type") == "Ready"), None)
    if ready is None:
        return "Node NotReady (no Ready condition yet)"
    if ready.get("status") != "True":
        why = ready.get("reason") or ready.get("message") or f"Ready={ready.get('status')}"
        return f"Node NotReady ({why})"
    return None


def _valid(model: type[BaseModel], obj: Mapping[str, Any], kind: str) -> Any:
    meta = obj.get("metadata") or {}
    if meta.get("deletionTimestamp"):
        return None
    try:
        return model.model_validate(obj.get("spec") or {})
    except ValidationError as exc:
        log.warning("skipping %s %s: %s", kind, meta.get("name"), exc.errors()[0]["msg"])
        return None


def view_of(
    edge_nodes: Mapping[str, Mapping[str, Any]],
    services: Mapping[str, Mapping[str, Any]],
    health: Mapping[str, str | None] | None,
) -> ClusterView:
    """The view of the cluster objects by name.

    `health` maps each Node to why it is down (None: up); a worker without an
    entry has no Node. `health` None: Node health is not followed.
    """
    view = ClusterView()
    for name in sorted(edge_nodes):
        spec = _valid(EdgeNodeSpec, edge_nodes[name], "EdgeNode")
        if spec is None:
            continue
        view.edge_nodes[name] = spec
        if health is not None and spec.role == "worker":
            why = health.get(name, node_down_reason(None))
            if why is not None:
                view.down[name] = why
    for name in sorted(services):
        sspec = _valid(LMServiceSpec, services[name], "LMService")
        if sspec is None:
            continue
        view.services[name] = sspec
        view.uids[name] = str((services[name].get("metadata") or {}).get("uid", ""))
    return view


def context_of(view: ClusterView, constants: LoopConstants) -> ClusterContext:
    """The context of `view`: its EdgeNodes that are up, its LMServices, by name."""
    return ClusterContext(
        nodes=[NodeInfo(name=n, spec=s) for n, s in view.edge_nodes.items() if n not in view.down],
        services=[ServiceInfo(name=n, spec=s) for n, s in view.services.items()],
        loop=constants,
    )


def _changed_fields(old: BaseModel, new: BaseModel) -> str:
    a, b = old.model_dump(by_alias=True), new.model_dump(by_alias=True)
    return ", ".join(k for k in sorted(a.keys() | b.keys()) if a.get(k) != b.get(k))


def diff_views(old: ClusterView, new: ClusterView) -> list[ContextChange]:
    """The changes from `old` to `new`, services first, then nodes, each by name."""
    out: list[ContextChange] = []
    for name in sorted(old.services.keys() | new.services.keys()):
        before, after = old.services.get(name), new.services.get(name)
        if before is None:
            out.append(ContextChange(kind="lm_added", name=name))
        elif after is None:
            out.append(ContextChange(kind="lm_removed", name=name, detail="LMService deleted"))
        elif before != after or old.uids.get(name) != new.uids.get(name):
            # a new uid is a delete and re-create between two slots: its pods are new owners'
            detail = _changed_fields(before, after) or "re-created"
            out.append(ContextChange(kind="lm_edited", name=name, detail=detail))
    for name in sorted(old.edge_nodes.keys() | new.edge_nodes.keys()):
        nb, na = old.edge_nodes.get(name), new.edge_nodes.get(name)
        if nb is None:
            out.append(ContextChange(kind="node_added", name=name))
        elif na is None:
            out.append(ContextChange(kind="node_removed", name=name, detail="EdgeNode deleted"))
        elif nb != na:
            out.append(ContextChange(kind="node_edited", name=name, detail=_changed_fields(nb, na)))
        if na is None:
            continue
        was, now = old.down.get(name), new.down.get(name)
        if now is not None and (was is None or nb is None):
            out.append(ContextChange(kind="node_down", name=name, detail=now))
        elif now is None and was is not None and nb is not None:
            out.append(ContextChange(kind="node_up", name=name, detail="Node Ready"))
    return out


def _reduce(resource: Resource, obj: Mapping[str, Any]) -> dict[str, Any]:
    """The part of an object the context depends on (status updates are not changes)."""
    meta = obj.get("metadata") or {}
    kept = {k: meta[k] for k in ("name", "uid", "deletionTimestamp") if meta.get(k)}
    if resource == "nodes":
        # A Node counts only through its health: heartbeats change nothing here.
        return {"metadata": kept, "down": node_down_reason(obj)}
    return {"metadata": kept, "spec": obj.get("spec") or {}}


class LiveCluster:
    """The watch cache and `LiveContext` of one namespace's LMServices (module docstring)."""

    def __init__(
        self,
        kube: KubeClient,
        namespace: str,
        constants: LoopConstants,
        *,
        watch: bool = True,
    ) -> None:
        self.kube = kube
        self.namespace = namespace
        self.constants = constants
        self.watching = watch
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._objects: dict[Resource, dict[str, dict[str, Any]]] = {r: {} for r in RESOURCES}
        self._version = 0  # bumped by every change of the reduced objects
        self._seen = 0
        self._follow_nodes = watch
        self._threads: list[threading.Thread] = []
        self._watches: dict[Resource, Any] = {}  # the running watch.Watch of each
        versions: dict[Resource, str] = {}
        if watch:
            for resource in RESOURCES:
                try:
                    versions[resource] = self._relist(resource)
                except ClusterRefused as exc:
                    if resource != "nodes":
                        raise
                    log.warning("Node health not followed (NotReady/cordoned unseen): %s", exc)
                    self._follow_nodes = False
        else:
            self._poll()
        self._seen = self._version
        self._view = self._current_view()
        self._ctx = context_of(self._view, constants)
        for resource, version in versions.items():
            thread = threading.Thread(
                target=self._follow,
                args=(resource, version),
                name=f"watch-{resource}",
                daemon=True,
            )
            thread.start()
            self._threads.append(thread)

    # -- what the loop and the node agents call ----------------------------------

    def context(self) -> ClusterContext:
        """The context of the last `update` (the initial one before any)."""
        return self._ctx

    def view(self) -> ClusterView:
        """The view of the last `update`, down workers included."""
        return self._view

    def owners(self) -> dict[str, str]:
        """Each LMService's uid (the owner reference of its model pods)."""
        return dict(self._view.uids)

    def update(self, slot: int) -> ContextUpdate:
        """The context from `slot` on and the changes since the last call (module doc)."""
        if not self.watching:
            self._poll()
        with self._lock:
            if self._version == self._seen:
                return ContextUpdate(slot=slot, context=self._ctx)
            self._seen = self._version
        view = self._current_view()
        changes = diff_views(self._view, view)
        self._view = view
        if changes:
            self._ctx = context_of(view, self.constants)
            for c in changes:
                log.info(
                    "slot %d: %s %s%s", slot, c.kind, c.name, f" ({c.detail})" * bool(c.detail)
                )
        return ContextUpdate(slot=slot, context=self._ctx, changes=changes)

    def close(self, timeout_s: float = 2.0) -> None:
        """Stop the watch threads (they are daemons: a stuck one cannot hold the exit)."""
        self._stop.set()
        for w in list(self._watches.values()):
            w.stop()
        for thread in self._threads:
            thread.join(timeout_s)

    # -- the cache -------------------------------------------------------------------

    def _current_view(self) -> ClusterView:
        with self._lock:
            edge = dict(self._objects["edgenodes"])
            services = dict(self._objects["lmservices"])
            health = (
                {n: o.get("down") for n, o in self._objects["nodes"].items()}
                if self._follow_nodes
                else None
            )
        return view_of(edge, services, health)

    def _replace(self, resource: Resource, objects: dict[str, dict[str, Any]]) -> None:
        with self._lock:
            if self._objects[resource] != objects:
                self._objects[resource] = objects
                self._version += 1

    def _apply(self, resource: Resource, kind: str, obj: Mapping[str, Any]) -> None:
        name = (obj.get("metadata") or {}).get("name")
        if not name:
            return
        with self._lock:
            store = self._objects[resource]
            if kind == "DELETED":
                if store.pop(name, None) is not None:
                    self._version += 1
                return
            reduced = _reduce(resource, obj)
            if store.get(name) != reduced:
                store[name] = reduced
                self._version += 1

    def _poll(self) -> None:
        """Polling mode: re-list EdgeNodes and LMServices through the thin client."""
        lists: list[tuple[Resource, list[dict[str, Any]]]] = [
            ("edgenodes", self.kube.list_edge_nodes()),
            ("lmservices", self.kube.list_lmservices(self.namespace)),
        ]
        for resource, items in lists:
            self._replace(resource, {o["metadata"]["name"]: _reduce(resource, o) for o in items})

    def _list_call(self, resource: Resource) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        if resource == "edgenodes":
            return self.kube.custom.list_cluster_custom_object, (GROUP, VERSION, "edgenodes")
        if resource == "lmservices":
            return self.kube.custom.list_namespaced_custom_object, (
                GROUP,
                VERSION,
                self.namespace,
                "lmservices",
            )
        return self.kube.core.list_node, ()

    def _relist(self, resource: Resource) -> str:
        """List `resource`, replace its copy; return the list's resourceVersion."""
        fn, args = self._list_call(resource)
        out: Any = self.kube.call(f"list {resource}", fn, *args)
        body = out if isinstance(out, dict) else self.kube.api.sanitize_for_serialization(out)  # type: ignore[no-untyped-call]
        items = body.get("items") or []
        self._replace(resource, {o["metadata"]["name"]: _reduce(resource, o) for o in items})
        return str((body.get("metadata") or {}).get("resourceVersion") or "")

    def _follow(self, resource: Resource, version: str | None) -> None:
        """The watch thread of one resource: watch, and relist when the watch breaks."""
        backoff = BACKOFF_S
        while not self._stop.is_set():
            try:
                if version is None:
                    version = self._relist(resource)
                version = self._watch(resource, version)
                backoff = BACKOFF_S
                continue
            except ApiException as exc:
                if exc.status == 410:  # too old a version: relist at once
                    version = None
                    continue
                why = f"HTTP {exc.status} {exc.reason}"
            except (urllib3.exceptions.HTTPError, OSError, LmedgeError, ValueError) as exc:
                why = f"{type(exc).__name__}: {exc}"
            except Exception as exc:  # the cache must outlive any one failure
                # A thread that died here would freeze this resource's view for
                # the rest of the run without a word; say what broke and relist.
                why = f"unexpected {type(exc).__name__}: {exc}"
            if self._stop.is_set():
                return
            log.warning("watch of %s broke (%s); relisting in %.1f s", resource, why, backoff)
            version = None
            self._stop.wait(backoff)
            backoff = min(MAX_BACKOFF_S, backoff * 2)

    def _watch(self, resource: Resource, version: str) -> str | None:
        """Apply events from `version` on; the last version seen, None after 410 Gone."""
        fn, args = self._list_call(resource)
        w = watch.Watch()  # type: ignore[no-untyped-call]
        self._watches[resource] = w
        connect = self.kube.retry.timeout[0]
        stream = w.stream(  # type: ignore[no-untyped-call]
            fn,
            *args,
            resource_version=version,
            timeout_seconds=WATCH_S,
            allow_watch_bookmarks=True,
            _request_timeout=(connect, WATCH_S + 30),
        )
        for event in stream:
            if self._stop.is_set():
                w.stop()  # type: ignore[no-untyped-call]
                break
            kind, obj = event.get("type"), event.get("raw_object") or {}
            version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
            if kind in ("ADDED", "MODIFIED", "DELETED"):
                self._apply(resource, str(kind), obj)
        return version
