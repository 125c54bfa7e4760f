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
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

import kopf

from lmedge.api import EdgeNodeSpec, LMServiceSpec, NodeInfo
from lmedge.errors import LmedgeError, ManifestError, TransientError
from lmedge.operator import kube, logic
from lmedge.operator.timeslicing import node_labels, render_configmap

GROUP, VERSION = kube.GROUP, kube.VERSION
#: Where the operator writes the NVIDIA device plugin's time-slicing ConfigMap.
TIMESLICING_NAMESPACE = os.environ.get("LMEDGE_TIMESLICING_NAMESPACE", "lmedge-system")
TIMESLICING_CONFIGMAP = os.environ.get("LMEDGE_TIMESLICING_CONFIGMAP", "lmedge-time-slicing")
#: `NAMESPACE/NAME` of the ConfigMap listing each LMService's image and uid in
#: the workload namespace, the parameter of the node agents' admission policy
#: (the chart's `<release>-model-images`); unset: not maintained.
MODEL_IMAGES = os.environ.get("LMEDGE_MODEL_IMAGES_CONFIGMAP", "")
#: Seconds between LMService status refreshes (success ratio, latency, instances).
STATUS_INTERVAL_S = float(os.environ.get("LMEDGE_STATUS_INTERVAL_S", "30"))


@contextmanager
def classified() -> Iterator[None]:
    """Map lmedge errors to kopf's retry semantics."""
    try:
        yield
    except ManifestError as exc:
        raise kopf.PermanentError(str(exc)) from exc
    except kube.NotFound as exc:
        raise kopf.TemporaryError(str(exc), delay=30) from exc
    except TransientError as exc:
        raise kopf.TemporaryError(str(exc), delay=10) from exc
    except LmedgeError as exc:
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
        render_configmap(_edge_nodes(exclude), TIMESLICING_CONFIGMAP, TIMESLICING_NAMESPACE)
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
    patch.status.update(logic.edge_node_status(es, problems, int(meta.get("generation", 0))))


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
    if not MODEL_IMAGES:
        return False
    namespace, _, name = MODEL_IMAGES.partition("/")
    return kube.set_configmap_data(
        namespace, name, logic.model_images(kube.list_lmservices(namespace))
    )


@kopf.on.event(GROUP, VERSION, "lmservices")
def model_images_follow_lmservices(namespace: str | None, logger: kopf.Logger, **_: Any) -> None:
    """Any LMService event in the workload namespace (new, new image, deleted): resync.

    Event handlers are not retried; the status timer below resyncs too, so a
    failed write is repaired within `STATUS_INTERVAL_S`.
    """
    _sync_model_images_logged(namespace, logger)


def _sync_model_images_logged(namespace: str | None, logger: kopf.Logger) -> None:
    """Resync when `namespace` is the workload namespace; a failure is logged, not raised."""
    if not MODEL_IMAGES or namespace != MODEL_IMAGES.partition("/")[0]:
        return
    try:
        if sync_model_images():
            logger.info("model images updated in ConfigMap %s", MODEL_IMAGES)
    except LmedgeError as exc:
        logger.warning("model images not updated: %s", exc)


def _service_stats(name: str) -> logic.ServiceStats | None:
    """Aggregates of the latest run in the store, if a store is configured."""
    from lmedge.store import open_store
    from lmedge.store.location import store_setting

    uri = store_setting()
    if not uri:
        return None

    store = open_store(uri)
    try:
        runs = store.runs(limit=1)
        if not runs:
            return None
        for s in store.lm_stats(runs[0].id):
            if s.lm == name:
                return logic.ServiceStats(
                    s.arrivals, s.success_ratio, s.mean_latency_s, rejected=s.rejected
                )
        return None
    finally:
        store.close()


@kopf.timer(GROUP, VERSION, "lmservices", interval=STATUS_INTERVAL_S, initial_delay=1)
def refresh_lmservice_status(
    name: str,
    namespace: str | None,
    meta: kopf.Meta,
    patch: kopf.Patch,
    logger: kopf.Logger,
    **_: Any,
) -> None:
    with classified():
        pods = kube.list_model_pods(namespace, name)
        stats = _service_stats(name)
    _sync_model_images_logged(namespace, logger)
    patch.status.update(logic.lmservice_status(pods, stats, int(meta.get("generation", 0))))
