"""The node agent: one per worker, the paper's LM Deployment Agent for its own
node, plus the actuation of what it decides.

Each slot (wall-clock slots anchored on the run's start, the same anchor as
the controller's):

1. observe its own node: the model pods bound to it (ready, or pending = not
   Ready), the headroom under its EdgeNode, the backlog its gateway reports;
2. read the role intent of the latest macro policy the controller stored;
3. call the deployer plugin through the controller's `DecisionGuard`
   (lmedge.controller.guard): a failure, or a value that is not a
   `Placement`, is replaced by the last-resort fallback, an infeasible one
   by `nearest_feasible` with the role priority (the LMs of the node's role
   intent kept longest, then those with backlog) — the same code as the
   controller loop's;
4. actuate on its own node only — `plan_node`, the pending rule, idempotent pod
   names — and tell its gateway which model pods now serve;
5. store the `Decision`, stamped like the loop stamps it.

Crash safety comes from the reconcile, not from local state: a restarted
agent lists the pods on its node, keeps the ones matching the placement by
name, deletes duplicates and pods of LMs it turns off, and creates only what
is missing. It keeps nothing on disk.

The agent never acts on another node: it lists pods with a field selector on
its node, and in a cluster the ValidatingAdmissionPolicies in `deploy/rbac/`
(the chart's) refuse its pod creates and deletes anywhere else, and any pod
that is not its LMService's model pod. It tells its gateway about its model
pods with its own Pod-bound service-account token, which that gateway alone
accepts from it (`lmedge.dataplane.auth`).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from lmedge.api import (
    ActuationResult,
    ClusterContext,
    Decision,
    Deployer,
    MacroPolicy,
    NodeObservation,
    Placement,
)
from lmedge.api.engine_telemetry import EngineTelemetry
from lmedge.api.engines import Mode, concurrent_requests, pod_protocol
from lmedge.api.gateway_control import ModelEndpoint
from lmedge.backends.kubernetes.backend import KubernetesBackend
from lmedge.backends.kubernetes.pods import MODEL_PORT, ObservedPod
from lmedge.controller.guard import DecisionGuard
from lmedge.errors import LmedgeError
from lmedge.nodeagent.telemetry import EngineScraper, TelemetryCollector
from lmedge.store import RunInfo, Store

__all__ = ["NodeAgent", "SlotReport", "latest_macro"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SlotReport:
    """What one slot of the agent did."""

    slot: int
    decision: Decision[Placement]
    actuation: ActuationResult
    #: The token engines' telemetry the deployer saw (None: none read).
    engines: list[EngineTelemetry] | None = None


def latest_macro(store: Store | None, run: str) -> MacroPolicy | None:
    """The newest macro policy the controller stored for `run` (None without one)."""
    if store is None or not run:
        return None
    try:
        found = store.decisions(agent="planner", run=run, limit=1)
    except Exception as exc:  # store down, or a stored policy this version cannot read
        log.warning("no macro policy from the store: %s: %s", type(exc).__name__, exc)
        return None
    value = found[0].value if found else None
    return value if isinstance(value, MacroPolicy) else None


def newer_run(store: Store, serving: RunInfo) -> str | None:
    """The id of a cluster run started after `serving` (a restarted controller's), if any.

    A store that cannot answer now is no news: the agent asks again next slot.
    """
    try:
        latest = store.latest_run(backend="kubernetes")
    except Exception as exc:  # the store is down or unreadable: keep serving
        log.debug("could not look for a newer run: %s: %s", type(exc).__name__, exc)
        return None
    if latest is None or latest.id == serving.id or latest.started <= serving.started:
        return None
    return latest.id


class NodeAgent:
    """Runs `deployer` for `node` each slot and actuates its placement there."""

    def __init__(
        self,
        node: str,
        backend: KubernetesBackend,
        deployer: Deployer,
        *,
        store: Store | None = None,
        telemetry: TelemetryCollector | None = None,
        engines: EngineScraper | None = None,
    ) -> None:
        # A worker that is down now (cordoned, NotReady) still gets its agent:
        # it drains the node now and serves again once the node is back.
        specs = backend.live.view().edge_nodes
        workers = sorted(n for n, s in specs.items() if s.role == "worker")
        if node not in workers:
            known = ", ".join(workers) or "none"
            raise LmedgeError(f"{node} is not a worker EdgeNode (workers: {known})")
        self.node = node
        self.backend = backend
        self.deployer = deployer
        self.store = store
        self.telemetry = telemetry
        #: Reads the token engines' /metrics of this node's pods (None: not read).
        self.engines = engines
        self.run_id = backend.settings.run
        #: The same guard as the controller loop's: call, validate, repair with
        #: the role priority, last-resort fallback, stamp.
        self.guard = DecisionGuard(self.run_id, backend.clock)
        self._previous: Placement | None = None

    @property
    def ctx(self) -> ClusterContext:
        return self.backend.context()

    def step(self, slot: int) -> SlotReport:
        """One slot: follow the cluster, observe, decide, validate, actuate, record.

        When this node is down (its Node NotReady or cordoned) or its EdgeNode
        is gone, the deployer is not asked: every model pod here is stopped
        (a drain), audited with the reason, until the node is back.
        """
        self.backend.refresh(slot)
        ctx = self.ctx
        if not ctx.has_node(self.node):
            return self._drain(slot)
        info = ctx.node(self.node)
        state = self.backend.node_snapshot(self.node)
        engines = self._scrape_engines(ctx)
        if engines is not None:
            state = state.model_copy(update={"engines": engines})
        macro = latest_macro(self.store, self.run_id)
        # The stored policy may predate a change of the cluster (the controller
        # re-plans at once, but its policy reaches the store a moment later):
        # an LM that no longer exists is no role.
        roles = [
            lm
            for lm in (macro.role_map().get(self.node, []) if macro else [])
            if ctx.has_service(lm)
        ]
        planned = macro.mode_map().get(self.node, {}) if macro else {}
        obs = NodeObservation(
            slot=slot,
            epoch=slot // ctx.loop.epoch_slots,
            node=info,
            services=ctx.services,
            roles=roles,
            modes={lm: m for lm, m in planned.items() if lm in roles},
            state=state,
            previous=self._previous,
            tau_s=ctx.loop.tau_s,
            slot_s=ctx.loop.slot_s,
        )
        decision = self.guard.place(
            self.deployer, info, ctx.services, obs, epoch=obs.epoch, slot=slot
        )
        actuation = self.backend.apply_placement(decision.value)
        self._previous = decision.value
        self._push_models()
        if self.store is not None:
            try:  # buffered and never raising for an outage; a bug must not stop the node
                self.store.record_decision(decision)
            except Exception:
                log.exception("slot %d on %s: decision not handed to the store", slot, self.node)
            self._collect_telemetry(engines)
        if actuation.errors:
            log.warning("slot %d on %s: %s", slot, self.node, "; ".join(actuation.errors))
        return SlotReport(slot, decision, actuation, engines)

    def _drain(self, slot: int) -> SlotReport:
        why = self.backend.live.view().down.get(self.node) or "its EdgeNode was deleted"
        decision = Decision[Placement](
            agent="deployer",
            policy=self.deployer.name,
            source="fallback",
            value=Placement(node=self.node, lms=[]),
            error=f"{self.node} is down ({why}): its model pods are stopped",
            run=self.run_id,
            epoch=slot // self.ctx.loop.epoch_slots,
            slot=slot,
            node=self.node,
            sim_time_s=self.backend.clock.now(),
        )
        actuation = self.backend.apply_placement(decision.value)
        self._previous = None
        self._push_models()
        if self.store is not None:
            try:
                self.store.record_decision(decision)
            except Exception:
                log.exception("slot %d on %s: decision not handed to the store", slot, self.node)
        if actuation.errors:
            log.warning("slot %d on %s: %s", slot, self.node, "; ".join(actuation.errors))
        return SlotReport(slot, decision, actuation)

    def _scrape_engines(self, ctx: ClusterContext) -> list[EngineTelemetry] | None:
        """The token engines' telemetry of this node's serving pods (None: none read).

        Only pods of a llama.cpp or vLLM LMService are read: a pipeline pod's
        /metrics counts prompts, which the agents get from the gateway.
        """
        if self.engines is None:
            return None
        try:
            pods = self.backend.kube.list_model_pods(self.backend.settings.namespace, self.node)
        except LmedgeError as exc:
            log.warning("engine telemetry of %s not read: %s", self.node, exc)
            return None
        return self.engines.read(ctx, pods)

    def _collect_telemetry(self, engines: list[EngineTelemetry] | None) -> None:
        """Scrape this node's exporters into the store, with `engines`.

        A silent exporter only logs.
        """
        if self.telemetry is None or self.store is None:
            return
        try:
            by_node = {self.node: engines} if engines else None
            asyncio.run(self.telemetry.collect_into(self.store, by_node))
        except (LmedgeError, OSError) as exc:
            log.warning("telemetry of %s not collected: %s", self.node, exc)
        except Exception:  # a malformed exporter page must not stop the node
            log.exception("telemetry of %s not collected", self.node)

    def _push_models(self) -> None:
        gateways = self.backend.gateways
        if gateways is None:
            return
        try:
            pods = self.backend.kube.list_model_pods(self.backend.settings.namespace, self.node)
        except LmedgeError as exc:
            log.warning("cannot list pods for the gateway: %s", exc)
            return
        gateways.push_models(self.node, model_endpoints(self.ctx, pods))

    def run(
        self,
        slots: int | None = None,
        stop: threading.Event | None = None,
        on_slot: Callable[[SlotReport], None] | None = None,
        superseded: Callable[[], str | None] | None = None,
    ) -> str | None:
        """Step at the start of every slot from the current one on, until `stop` is set.

        A slot whose step fails (API server down, or anything unexpected) is
        skipped and logged; the next slot reconciles from scratch. Nothing a
        slot raises stops the agent. `superseded`, asked after every slot,
        names a run that replaces this one: the agent then stops and returns
        it (None when it stopped for `stop` or `slots`).
        """
        stop = stop or threading.Event()
        clock = self.backend.wall_clock
        slot_s = self.ctx.loop.slot_s
        slot = clock.slot(slot_s)
        done = 0
        while not stop.is_set() and (slots is None or done < slots):
            try:
                report = self.step(slot)
            except LmedgeError as exc:
                log.warning("slot %d on %s skipped: %s", slot, self.node, exc)
            except Exception:
                log.exception("slot %d on %s failed; skipped", slot, self.node)
            else:
                if on_slot is not None:
                    on_slot(report)
            done += 1
            newer = superseded() if superseded is not None else None
            if newer is not None:
                return newer
            slot = max(slot + 1, clock.slot(slot_s))
            while not stop.is_set() and clock.now() < slot * slot_s:
                stop.wait(min(0.5, max(0.0, slot * slot_s - clock.now())))
        return None


def model_endpoints(ctx: ClusterContext, pods: list[ObservedPod]) -> list[ModelEndpoint]:
    """The Ready pods as the gateway needs them: URL, what each speaks, how many at once.

    The protocol and the concurrency come from the pod's LMService engine
    (`pod_protocol`, `concurrent_requests` in the pod's mode); an LM the
    context no longer knows is left out (its pod is going).
    """
    known = set(ctx.lm_names)
    modes = {p.lm: p.mode for p in pods if p.ready and not p.deleting}
    out = []
    for lm, url in serving_endpoints(pods).items():
        if lm not in known:
            continue
        spec = ctx.service(lm).spec
        mode: Mode = "cpu" if modes.get(lm) == "cpu" else "gpu"
        out.append(
            ModelEndpoint(
                lm=lm,
                url=url,
                protocol=pod_protocol(spec.engine.kind),
                concurrency=concurrent_requests(spec, mode),
            )
        )
    return out


def serving_endpoints(pods: list[ObservedPod]) -> dict[str, str]:
    """{lm: URL} of the Ready model pods (one per LM; the first by name wins)."""
    out: dict[str, str] = {}
    for p in sorted(pods, key=lambda p: p.name):
        if p.ready and not p.deleting and p.ip and p.lm not in out:
            out[p.lm] = f"http://{p.ip}:{MODEL_PORT}"
    return out
