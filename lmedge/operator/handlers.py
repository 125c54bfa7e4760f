"""kopf handlers for `EdgeNode` and `LMService`: validate, call a plain
function, return status. Retry semantics are explicit: a bad spec is a
`kopf.PermanentError` (retrying cannot fix it); an API conflict, throttling or
a missing Node is a `kopf.TemporaryError` with a delay.

Deletion: an EdgeNode carries kopf's finalizer so its Node labels and its
share of the time-slicing ConfigMap are removed; an LMService needs none —
its model pods carry owner references and the garbage collector removes them.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import TYPE_CHECKING, Any

import kopf

from lmedge.api import ClusterContext, EdgeNodeSpec, LMServiceSpec, LoopConstants, NodeInfo
from lmedge.backends.kubernetes.live import ClusterView, context_of, node_down_reason, view_of
from lmedge.backends.kubernetes.pods import ObservedPod
from lmedge.errors import LmedgeError, ManifestError
from lmedge.operator import kube, logic
from lmedge.operator.settings import HandlerSettings
from lmedge.operator.timeslicing import node_labels, render_configmap

if TYPE_CHECKING:
    from lmedge.store import Store

GROUP, VERSION = kube.GROUP, kube.VERSION
#: The handlers' environment, read once when kopf loads this module (a timer's
#: interval is fixed when it is registered); see `HandlerSettings`.
SETTINGS = HandlerSettings.from_environ(os.environ)


@contextmanager
def classified() -> Iterator[None]:
    """Map lmedge errors to kopf's retry semantics by their class (`lmedge.errors`).

    A `retryable` error (an API outage, a conflict, a Node not there yet) is
    a `kopf.TemporaryError` retried after its class's `retry_delay_s`; any
    other (a bad spec, a refusal by RBAC or admission) a `kopf.PermanentError`.
    """
    try:
        yield
    except LmedgeError as exc:
        if exc.retryable:
            raise kopf.TemporaryError(str(exc), delay=exc.retry_delay_s) from exc
        raise kopf.PermanentError(str(exc)) from exc


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """The pod's service account in a cluster, else $KUBECONFIG (read now, not at import)."""
    info: kopf.ConnectionInfo | None = kopf.login_with_service_account(**kwargs)
    return info or kopf.login_with_kubeconfig(**kwargs)


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    # kopf logs in by itself; the handlers' own client (`kube`) needs the same
    # cluster: in-cluster config in a pod, else $KUBECONFIG.
    kube.load_config()
    settings.posting.level = logging.WARNING
    settings.persistence.finalizer = "lmedge.io/finalizer"
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.execution.max_workers = 8


def _edge_nodes(exclude: str | None = None) -> list[NodeInfo]:
    out = []
    for obj in kube.list_edge_nodes():
        name = obj["metadata"]["name"]
        if name == exclude or obj["metadata"].get("deletionTimestamp"):
            continue
        try:
            spec = logic.parse_spec(EdgeNodeSpec, obj.get("spec") or {}, "EdgeNode", name)
        except ManifestError:
            continue  # its own handler reports it; one bad object must not block the rest
        out.append(NodeInfo(name=name, spec=spec))
    return out


def sync_timeslicing(exclude: str | None = None) -> None:
    kube.apply_configmap(
        render_configmap(
            _edge_nodes(exclude), SETTINGS.timeslicing_configmap, SETTINGS.timeslicing_namespace
        )
    )


@kopf.on.resume(GROUP, VERSION, "edgenodes")
@kopf.on.create(GROUP, VERSION, "edgenodes")
@kopf.on.update(GROUP, VERSION, "edgenodes", field="spec")
def reconcile_edge_node(
    name: str,
    spec: kopf.Spec,
    meta: kopf.Meta,
    body: kopf.Body,
    patch: kopf.Patch,
    logger: kopf.Logger,
    **_: Any,
) -> None:
    with classified():
        es = logic.parse_spec(EdgeNodeSpec, spec, "EdgeNode", name)
        try:
            allocatable = kube.node_allocatable(name)
        except kube.NotFound:
            kopf.warn(body, reason="NodeMissing", message=f"no Node named {name}")
            raise
        problems = logic.capacity_problems(es, allocatable)
        kube.label_node(name, node_labels(NodeInfo(name=name, spec=es)))
        sync_timeslicing()
    for problem in problems:
        kopf.warn(body, reason="CapacityMismatch", message=problem)
    logger.info("EdgeNode %s reconciled (%d problems)", name, len(problems))
    status = logic.edge_node_status(es, problems, int(meta.get("generation", 0)))
    before = (body.get("status") or {}).get("conditions")
    conditions = logic.with_condition(before, status["conditions"][0])
    with classified():
        node = next((n for n in kube.list_nodes() if n["metadata"]["name"] == name), None)
    health = logic.edge_node_ready_condition(es.role, node_down_reason(node))
    status["conditions"] = logic.with_condition(conditions, health)
    patch.status.update(status)


@kopf.on.delete(GROUP, VERSION, "edgenodes")
def forget_edge_node(name: str, **_: Any) -> None:
    with classified():
        # The Node may have gone first; then there is nothing to unlabel.
        with suppress(kube.NotFound):
            kube.label_node(name, {k: None for k in node_labels(_placeholder(name))})
        sync_timeslicing(exclude=name)


def _placeholder(name: str) -> NodeInfo:
    return NodeInfo(name=name, spec=EdgeNodeSpec(cpu_cores=1, memory_gib=1))


@kopf.on.resume(GROUP, VERSION, "lmservices")
@kopf.on.create(GROUP, VERSION, "lmservices")
@kopf.on.update(GROUP, VERSION, "lmservices", field="spec")
def validate_lmservice(
    name: str, spec: kopf.Spec, meta: kopf.Meta, patch: kopf.Patch, **_: Any
) -> None:
    with classified():
        logic.parse_spec(LMServiceSpec, spec, "LMService", name)
    patch.status["conditions"] = [
        logic.condition("Valid", True, "SpecValid", "spec validated by the operator")
    ]
    patch.status["observedGeneration"] = int(meta.get("generation", 0))


def sync_model_images() -> bool:
    """Rewrite the model-images ConfigMap from the workload namespace's LMServices."""
    if not SETTINGS.model_images:
        return False
    namespace, _, name = SETTINGS.model_images.partition("/")
    images = logic.model_images(kube.list_lmservices(SETTINGS.model_images_for))
    return kube.set_configmap_data(namespace, name, images)


@kopf.on.event(GROUP, VERSION, "lmservices")
def model_images_follow_lmservices(namespace: str | None, logger: kopf.Logger, **_: Any) -> None:
    """Any LMService event in the workload namespace (new, new image, deleted): resync.

    Event handlers are not retried; the status timer below resyncs too, so a
    failed write is repaired within `SETTINGS.status_interval_s`.
    """
    _sync_model_images_logged(namespace, logger)


def _sync_model_images_logged(namespace: str | None, logger: kopf.Logger) -> None:
    """Resync when `namespace` is the workload namespace; a failure is logged, not raised."""
    if not SETTINGS.model_images or namespace != SETTINGS.model_images_for:
        return
    try:
        if sync_model_images():
            logger.info("model images updated in ConfigMap %s", SETTINGS.model_images)
    except LmedgeError as exc:
        logger.warning("model images not updated: %s", exc)


# One store connection for the whole process, opened on first use (kopf runs
# sync handlers on a thread pool: the lock serializes the store calls).
_store_lock = threading.Lock()
_store: Store | None = None
_windows: dict[tuple[str, str], logic.StatsWindow] = {}


def shared_store() -> Store | None:
    """The process's store (None when none is configured); opened once."""
    global _store
    from lmedge.store import open_store
    from lmedge.store.location import store_setting

    if _store is None:
        uri = store_setting()
        if not uri:
            return None
        _store = open_store(uri)
    return _store


@kopf.on.cleanup()
def close_store(**_: Any) -> None:
    global _store
    with _store_lock:
        if _store is not None:
            _store.close()
            _store = None


def _service_stats(namespace: str, name: str, logger: kopf.Logger) -> logic.ServiceStats | None:
    """Outcomes of `name` over the status window of the latest run, if a store is set."""
    try:
        with _store_lock:
            store = shared_store()
            if store is None:
                return None
            runs = store.runs(limit=1)
            if not runs:
                return None
            run = runs[0].id
            found = next((s for s in store.lm_stats(run) if s.lm == name), None)
    except LmedgeError as exc:  # the store is down: the status goes on without stats
        logger.warning("no request statistics for %s: %s", name, exc)
        return None
    totals = logic.Totals(0, 0, 0.0)
    if found is not None:
        latency = (found.mean_latency_s or 0.0) * found.successes
        totals = logic.Totals(found.arrivals, found.successes, latency, found.rejected)
    window = _windows.setdefault((namespace, name), logic.StatsWindow(SETTINGS.status_window_s))
    return window.add(run, time.monotonic(), totals)


def cluster_view(namespace: str) -> tuple[ClusterContext, ClusterView, list[ObservedPod]]:
    """The cluster as the loop sees it now: up workers, LMServices, Node health, model pods."""
    view = view_of(
        {o["metadata"]["name"]: o for o in kube.list_edge_nodes()},
        {o["metadata"]["name"]: o for o in kube.list_lmservices(namespace)},
        {n["metadata"]["name"]: node_down_reason(n) for n in kube.list_nodes()},
    )
    return context_of(view, LoopConstants()), view, kube.list_model_pods(namespace)


@kopf.timer(GROUP, VERSION, "lmservices", interval=SETTINGS.status_interval_s, initial_delay=1)
def refresh_lmservice_status(
    name: str,
    namespace: str | None,
    meta: kopf.Meta,
    status: kopf.Status,
    patch: kopf.Patch,
    logger: kopf.Logger,
    **_: Any,
) -> None:
    ns = namespace or "default"
    with classified():
        ctx, view, pods = cluster_view(ns)
        stats = _service_stats(ns, name, logger)
    _sync_model_images_logged(namespace, logger)
    if name not in view.services:
        return  # a spec that does not validate: validate_lmservice reports it
    patch.status.update(
        logic.lmservice_status(
            [p for p in pods if p.lm == name],
            stats,
            int(meta.get("generation", 0)),
            lm=name,
            ctx=ctx,
            down=view.down,
            all_pods=pods,
            previous=status.get("conditions"),
            window_s=SETTINGS.status_window_s,
        )
    )


#: The NodeReady condition each EdgeNode was last given (by this process).
_node_health: dict[str, str | None] = {}


@kopf.on.event("", "v1", "nodes")
def edge_node_follows_node_health(
    name: str, type: str | None, body: kopf.Body, logger: kopf.Logger, **_: Any
) -> None:
    """A Node went NotReady, was cordoned, came back or was deleted: its EdgeNode's
    NodeReady condition says so.

    A Node event, not a timer on the EdgeNode: kopf stops an object's timers
    before it releases the finalizer, which would hold every EdgeNode deletion.
    Heartbeats change nothing here (only the health is compared), and an event
    handler is not retried: the next event, or the resume after a restart,
    writes what a failed patch missed.
    """
    why = node_down_reason(None if type == "DELETED" else dict(body))
    if _node_health.get(name, "unset") == why:
        return
    try:
        edge = kube.read_edge_node(name)
        if edge is None:
            return  # a Node with no EdgeNode (e.g. a control-plane node)
        role = str((edge.get("spec") or {}).get("role", "worker"))
        ready = logic.edge_node_ready_condition(role, why)
        conditions = (edge.get("status") or {}).get("conditions")
        kube.set_edge_node_conditions(name, logic.with_condition(conditions, ready))
    except LmedgeError as exc:
        logger.warning("NodeReady of EdgeNode %s not updated: %s", name, exc)
        return
    _node_health[name] = why
