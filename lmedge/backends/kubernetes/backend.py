"""`KubernetesBackend`: the `ClusterBackend` of a real cluster.

The world is read, never simulated:

- context: the `EdgeNode`s (cluster-wide) whose Node is up and the
  `LMService`s of one namespace, plus the loop constants of
  `KubernetesSettings`, followed live by a watch cache (`live.LiveCluster`):
  `refresh(slot)` returns what changed since the last slot, with no API
  round trip;
- snapshot: per node, the model pods (ready or pending = not Ready) and the
  headroom left by their requests under the EdgeNode's spec; the backlog Q_ni
  is the queue depth the node's gateway reports, or 0 without gateways; the
  token engines' telemetry (KV usage, running and waiting sequences) is their
  pods' `/metrics`, read by the `engines` reader the controller gives;
- arrivals: the future is unknown on a cluster, so slot t announces every
  (worker, LM) pair whose LM some worker can host, with the request and
  prompt counts of the records that finished during slot t-1 (in steady state
  as many finish per slot as arrive; 0 for pairs with none).
  Announcing every pair keeps each gateway's routing map complete, so a
  request of a pair quiet last slot still finds a route;
- publish_routing: pushed to every gateway (`PUT /control/routing`); the loop
  stores the decision too, so a gateway that missed a push can be audited;
- apply_placement: `plan_node` (with the pending rule), then delete and create
  model pods through `KubeClient` (retries on 409/429/5xx, timeouts).
  Re-applying a placement finds the pods it wants by name and changes nothing;
- drain_records / telemetry: what gateways and node agents wrote to the store
  for this run (records are idempotent by id, so the loop re-storing them is
  harmless); without a store, nothing.

Errors of one node's actuation are reported in its `ActuationResult`, never
raised: the loop must go on with the other nodes.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from lmedge.api import (
    ActuationResult,
    Arrival,
    Clock,
    ClusterContext,
    InstanceState,
    LoopConstants,
    NodeInfo,
    NodeState,
    NodeTelemetry,
    Placement,
    RequestRecord,
    RoutingMap,
    ServiceInfo,
    Snapshot,
)
from lmedge.api.engine_telemetry import EngineTelemetry
from lmedge.api.gateway_control import RequestRouting, RoutingUpdate
from lmedge.api.live import ContextUpdate
from lmedge.api.runconfig import PolicyConfig
from lmedge.backends.kubernetes.client import KubeClient
from lmedge.backends.kubernetes.gateways import GatewayClient
from lmedge.backends.kubernetes.live import LiveCluster, context_of, view_of
from lmedge.backends.kubernetes.pods import ObservedPod, model_pod, plan_node
from lmedge.errors import LmedgeError
from lmedge.store import RecordCursor, Store

__all__ = ["KubernetesBackend", "KubernetesSettings", "WallClock", "load_context"]

log = logging.getLogger(__name__)


class WallClock:
    """Seconds since `start` (Unix time) on the wall clock.

    Node agents and the controller anchor on the same `start` (the run's
    start), so their slot boundaries agree to within clock skew.
    """

    def __init__(self, start: float | None = None) -> None:
        self.start = time.time() if start is None else start

    def now(self) -> float:
        return max(0.0, time.time() - self.start)

    def sleep_until(self, t: float) -> None:
        delay = self.start + t - time.time()
        if delay > 0:
            time.sleep(delay)

    def slot(self, slot_s: float) -> int:
        """The slot the clock is in now."""
        return int(self.now() // slot_s)


@dataclass(frozen=True)
class KubernetesSettings:
    """Where the backend acts and the loop's constants.

    `namespace`: where the LMServices and their model pods live (default
    `default`). `loop` holds the run's slot, epoch, tau and lambda (default:
    the paper's). `gateways` maps a
    node to its gateway's base URL; empty means no data plane (backlog 0, no
    routing push). `gateway_url_template` (e.g. `http://{node}.gw:8080`) gives
    the gateway of a worker that joins later (an EdgeNode applied mid-run).
    `control_token` is the credential of the gateways' control API: a token,
    or a file holding one (a projected service-account token, re-read as the
    kubelet rotates it). `run` names the run in records
    and gateway pushes. `model_service_account` is the account model pods run
    as (None: the namespace's `default`); `progress_root` is where this
    process sees the host's progress directory (`pods.PROGRESS_HOST_PATH`),
    to create each LM's subdirectory owned by itself before its pod starts
    (None: the kubelet creates it). `watch` follows the cluster with watches
    (default); False re-lists EdgeNodes and LMServices at every `refresh`
    and does not follow Node health (tests, debugging).
    """

    namespace: str = "default"
    loop: LoopConstants = field(default_factory=LoopConstants)
    gateways: Mapping[str, str] = field(default_factory=dict)
    gateway_url_template: str | None = None
    control_token: str | Path | None = None
    run: str = ""
    model_service_account: str | None = None
    progress_root: Path | None = None
    watch: bool = True


def load_context(
    kube: KubeClient, settings: KubernetesSettings
) -> tuple[ClusterContext, dict[str, str]]:
    """The context from one listing of the API server, and each LMService's uid (for owner refs).

    Built as the live watch builds it (`live.view_of`, `live.context_of`):
    EdgeNodes and LMServices being deleted or whose spec does not validate
    are left out (the operator reports those). Node health is not followed.
    """
    view = view_of(
        {o["metadata"]["name"]: o for o in kube.list_edge_nodes()},
        {o["metadata"]["name"]: o for o in kube.list_lmservices(settings.namespace)},
        None,
    )
    return context_of(view, settings.loop), view.uids


def node_state(
    node: NodeInfo,
    pods: Sequence[ObservedPod],
    services: Mapping[str, ServiceInfo],
    backlog: Mapping[str, int] | None = None,
    engines: list[EngineTelemetry] | None = None,
) -> NodeState:
    """One node's state from its model pods: instances and the headroom they leave
    (and `engines`, the telemetry of its token-engine pods, when read).

    Pods being deleted still hold their resources until they are gone (the
    scheduler counts them too), so they count against headroom but are not
    instances.
    """
    spec = node.spec
    mine = [p for p in pods if p.node == node.name]
    instances = [
        InstanceState(
            lm=p.lm,
            mode="gpu" if p.mode == "gpu" or p.vgpus else "cpu",
            cpu_cores=p.cpu_cores,
            vgpus=p.vgpus,
            status="ready" if p.ready else "pending",
        )
        for p in sorted(mine, key=lambda p: (p.lm, p.name))
        if not p.deleting and p.lm in services
    ]
    vram = sum(services[p.lm].spec.min_vram_gib for p in mine if p.vgpus and p.lm in services)
    return NodeState(
        name=node.name,
        backlog=dict(sorted((backlog or {}).items())),
        instances=instances,
        free_cpu_cores=max(0.0, spec.cpu_cores - sum(p.cpu_cores for p in mine)),
        free_memory_gib=max(0.0, spec.memory_gib - sum(p.memory_gib for p in mine)),
        free_vgpus=max(0, spec.total_vgpus - sum(p.vgpus for p in mine)),
        free_vram_gib=max(0.0, spec.total_vram_gib - vram),
        engines=engines,
    )


def _progress_dir(root: Path, lm: str) -> None:
    """Create `lm`'s progress directory under `root`, owned by this process.

    The model server runs as the same uid as the node agent (10001), and a
    hostPath the kubelet creates is root-owned 0755: the model server could
    not write its progress there.
    """
    try:
        (root / lm).mkdir(mode=0o750, exist_ok=True)
    except OSError as exc:
        raise LmedgeError(f"cannot create the progress directory {root / lm}: {exc}") from exc


def _gpu_vram_gib(ctx: ClusterContext, node: str) -> float | None:
    """vRAM of `node`'s first GPU (a vLLM pod's share is of one GPU); None if unknown."""
    if not ctx.has_node(node) or not ctx.node(node).spec.gpus:
        return None
    return ctx.node(node).spec.gpus[0].vram_gib


def actuate(
    kube: KubeClient,
    placement: Placement,
    ctx: ClusterContext,
    owners: Mapping[str, str],
    namespace: str,
    observed: Sequence[ObservedPod],
    *,
    service_account: str | None = None,
    progress_root: Path | None = None,
) -> ActuationResult:
    """Reconcile one node's model pods to `placement` (shared by backend and node agent).

    `service_account` and `progress_root` as in `KubernetesSettings`.
    """
    services = {s.name: s for s in ctx.services}
    actions = plan_node(placement, observed, services)
    by_name = {p.name: p for p in observed}
    result = ActuationResult(node=placement.node, voided=list(actions.voided))
    deleted: set[str] = set()
    for name in actions.delete:
        try:
            kube.delete_pod(namespace, name)
            deleted.add(by_name[name].lm)
        except LmedgeError as exc:
            result.errors.append(str(exc))
    created: set[str] = set()
    for target in actions.create:
        manifest = model_pod(
            services[target.lm],
            target,
            placement.node,
            namespace,
            owners.get(target.lm),
            service_account=service_account,
            gpu_vram_gib=_gpu_vram_gib(ctx, placement.node),
        )
        try:
            if progress_root is not None and services[target.lm].spec.engine.kind == "pipeline":
                _progress_dir(progress_root, target.lm)
            kube.create_pod(manifest)
            created.add(target.lm)
        except LmedgeError as exc:
            result.errors.append(str(exc))
    result.resized = sorted(deleted & created)
    result.started = sorted(created - deleted)
    result.stopped = sorted(deleted - created - set(actions.unchanged))
    return result


class EngineReader(Protocol):
    """Reads the token engines' telemetry of model pods (`nodeagent.telemetry.EngineScraper`)."""

    def read(
        self, ctx: ClusterContext, pods: Sequence[ObservedPod]
    ) -> list[EngineTelemetry] | None: ...


class KubernetesBackend:
    """`ClusterBackend` over a Kubernetes API server (module docstring).

    `engines`, when given, reads the token-engine pods' telemetry into each
    snapshot's `NodeState.engines` (KV usage, running and waiting sequences):
    what the planner, the router and the gateways' request routers see, as in
    the emulator.
    """

    def __init__(
        self,
        kube: KubeClient,
        settings: KubernetesSettings,
        *,
        store: Store | None = None,
        clock: WallClock | None = None,
        gateways: GatewayClient | None = None,
        engines: EngineReader | None = None,
    ) -> None:
        self.kube = kube
        self.engines = engines
        self.settings = settings
        self.store = store
        self.wall_clock = clock or WallClock()
        #: The loop's view of the same clock (the `ClusterBackend` protocol).
        self.clock: Clock = self.wall_clock
        self.gateways = gateways or (
            GatewayClient(
                settings.gateways, settings.control_token, template=settings.gateway_url_template
            )
            if settings.gateways or settings.gateway_url_template
            else None
        )
        self.live = LiveCluster(kube, settings.namespace, settings.loop, watch=settings.watch)
        self._ctx, self._owners = self.live.context(), self.live.owners()
        if self.gateways is not None:
            # The workers already there when the controller starts (a restart, an upgrade,
            # a new leader) are no change for `refresh`: their gateways are added here.
            self.gateways.add_nodes(n.name for n in self._ctx.workers)
        # Records reach the loop incrementally: only those stored since the last
        # slot are read, and what is remembered is bounded by the lookback window.
        self._cursor = RecordCursor(settings.run)
        self._last_arrivals: Counter[tuple[str, str]] = Counter()
        self._last_prompts: Counter[tuple[str, str]] = Counter()
        # request-level routing at the gateways: (policy, window s, most a call)
        self._request_routing: tuple[PolicyConfig, float, int] | None = None
        self._snapshot: Snapshot | None = None

    def route_requests_at_gateways(self, policy: PolicyConfig, window_s: float, most: int) -> None:
        """Make every later push carry `RequestRouting`: each gateway routes its own
        requests in windows with `policy`'s router (the control loop installs it)."""
        self._request_routing = (policy, window_s, most)

    def context(self) -> ClusterContext:
        return self._ctx

    def refresh(self, slot: int) -> ContextUpdate:
        """The live context from `slot` on (the watch cache; no API call when nothing changed).

        A down or deleted node leaves the context, so it is in no snapshot,
        arrival, routing map or placement from this slot on; a deleted
        LMService likewise (its pods are deleted by the node agents' next
        reconcile, and by the garbage collector through their owner reference).
        """
        update = self.live.update(slot)
        if update.changed:
            self._ctx, self._owners = update.context, self.live.owners()
            if self.gateways is not None:
                # a worker that joined is routed through its gateway from this slot on
                self.gateways.add_nodes(n.name for n in self._ctx.workers)
        return update

    def snapshot(self, slot: int) -> Snapshot:
        pods = self.kube.list_model_pods(self.settings.namespace)
        services = {s.name: s for s in self._ctx.services}
        workers = [n.name for n in self._ctx.workers]
        depths = self.gateways.queue_depths(workers) if self.gateways else {}
        engines: dict[str, list[EngineTelemetry]] = {}
        on = {p.name: p.node for p in pods}
        for e in (self.engines.read(self._ctx, pods) if self.engines else None) or ():
            if e.pod in on:
                engines.setdefault(on[e.pod], []).append(e)
        self._snapshot = Snapshot(
            slot=slot,
            time_s=self.clock.now(),
            nodes=[
                node_state(n, pods, services, depths.get(n.name), engines.get(n.name))
                for n in self._ctx.workers
            ],
        )
        return self._snapshot

    def node_snapshot(self, node: str) -> NodeState:
        """One node's state (what its node agent observes)."""
        pods = self.kube.list_model_pods(self.settings.namespace, node=node)
        services = {s.name: s for s in self._ctx.services}
        depths = self.gateways.queue_depths([node]) if self.gateways else {}
        return node_state(self._ctx.node(node), pods, services, depths.get(node))

    def arrivals(self, slot: int) -> list[Arrival]:
        out: list[Arrival] = []
        for origin in self._ctx.workers:
            for lm in self._ctx.lm_names:
                if not self._ctx.feasible_nodes(lm):
                    continue
                key = (origin.name, lm)
                out.append(
                    Arrival(
                        origin=origin.name,
                        lm=lm,
                        requests=self._last_arrivals[key],
                        prompts=self._last_prompts[key],
                    )
                )
        return out

    def publish_routing(self, slot: int, routing: RoutingMap) -> None:
        """Push the map to every gateway, with the LMServices in force and the nodes lost.

        A gateway serves exactly the pushed LMServices from then on and ends
        the sets waiting for one that left (`lm_removed`) or at or for a node
        that left (`node_lost`), writing their records.
        """
        if self.gateways is None:
            return
        ctx = self._ctx
        classes: dict[str, list[str]] = {}
        for s in ctx.services:
            for name in s.spec.serves:
                if name != s.name:
                    classes.setdefault(name, []).append(s.name)
        update = RoutingUpdate(
            run=self.settings.run,
            slot=slot,
            run_started_at=self.wall_clock.start,
            slot_s=self.settings.loop.slot_s,
            tau_s=self.settings.loop.tau_s,
            routing=routing,
            services={s.name: s.spec.modality for s in ctx.services},
            classes=classes,
            lost=sorted(n for n in self.gateways.urls if not ctx.has_node(n)),
            requests=self._requests_push(slot),
        )
        failed = self.gateways.push_routing(update)
        if failed:
            log.warning("slot %d: routing not delivered to %s", slot, ", ".join(failed))

    def _requests_push(self, slot: int) -> RequestRouting | None:
        """What the gateways need to route request by request this slot (None: the map).

        The slot's snapshot (taken by the loop before it routed) is the
        gateways' view of the deployed pairs and their queues.
        """
        if self._request_routing is None:
            return None
        policy, window_s, most = self._request_routing
        snapshot = self._snapshot if self._snapshot is not None else self.snapshot(slot)
        return RequestRouting(
            policy=policy,
            context=self._ctx,
            snapshot=snapshot,
            window_s=window_s,
            window_requests=most,
            budget_s=window_s,
        )

    def apply_placement(self, placement: Placement) -> ActuationResult:
        if not self._ctx.has_node(placement.node) and any(p.mode != "off" for p in placement.lms):
            # A node that is down or gone may only be emptied (its agent drains it).
            return ActuationResult(
                node=placement.node, errors=[f"no EdgeNode {placement.node} that is up"]
            )
        try:
            observed = self.kube.list_model_pods(self.settings.namespace, node=placement.node)
        except LmedgeError as exc:
            return ActuationResult(node=placement.node, errors=[str(exc)])
        return actuate(
            self.kube,
            placement,
            self._ctx,
            self._owners,
            self.settings.namespace,
            observed,
            service_account=self.settings.model_service_account,
            progress_root=self.settings.progress_root,
        )

    def drain_records(self) -> list[RequestRecord]:
        if self.store is None or not self.settings.run:
            return []
        if self._cursor.run != self.settings.run:
            self._cursor = RecordCursor(self.settings.run)
        try:
            fresh = self.store.requests_after(self._cursor)
        except LmedgeError as exc:
            log.warning("no request records this slot: %s", exc)
            return []
        # Requests finished in the last slot estimate the next slot's arrivals:
        # in steady state as many finish per slot as arrive.
        self._last_arrivals, self._last_prompts = Counter(), Counter()
        for r in fresh:
            self._last_arrivals[(r.origin, r.lm)] += 1
            self._last_prompts[(r.origin, r.lm)] += r.prompts
        return fresh

    def telemetry(self) -> list[NodeTelemetry]:
        # Node agents store their own node's telemetry; the loop would only copy it.
        return []

    def close(self) -> None:
        self.live.close()
        if self.gateways is not None:
            self.gateways.close()
