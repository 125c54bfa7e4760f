"""The `lmedge controller` process: operator + planner + scheduler, one active replica.

Leader election gates everything: a replica first takes the Lease
(`lmedge.backends.kubernetes.leader`), then runs

- the kopf operator (`lmedge.operator.handlers`) in a thread with its own
  event loop (`kopf.operator`, as `kopf.testing.KopfRunner` does), and
- the controller loop (`lmedge.controller.loop.ControlLoop`, unchanged) over
  the `KubernetesBackend` with the planner and the router of the chosen
  profile. Its deployers are remote: each worker's node agent runs the
  profile's deployer for its own node, so the loop is given none (a loop
  without deployers decides and publishes the macro policy and the routing
  only; node agents read the macro policy's role intent from the store).

This is the process's composition root (`lmedge.processes`): `main` connects
the Kubernetes client and the store, registers the plugins and runs
`run_controller`; `lmedge controller` only parses its flags into
`ControllerSettings`. It composes the operator with the loop, both of which
sit below it in the layering.

When the Lease is lost both stop and `run_controller` returns 1, so the
Deployment restarts the replica as a candidate; a replica that never acted
cannot double-act. Configuration comes from flags / Helm values (no settings
CRD), read once at start; the run's `RunConfig` (loop constants, policy,
plugin parameters, seed) is stored with the run, where every node agent and
gateway reads it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from lmedge.api import MacroPolicy
from lmedge.api.runconfig import DEFAULT_PROFILE, RunConfig
from lmedge.backends.kubernetes.backend import (
    KubernetesBackend,
    KubernetesSettings,
    WallClock,
    load_context,
)
from lmedge.backends.kubernetes.client import KubeClient
from lmedge.backends.kubernetes.leader import LeaseElector
from lmedge.controller.assembly import PolicyChoice, PolicyPlugins, build_plugins
from lmedge.controller.gctune import quiet_gc
from lmedge.controller.loop import ControlLoop
from lmedge.controller.prometheus import ControlPlaneMetrics
from lmedge.errors import LmedgeError
from lmedge.nodeagent.telemetry import EngineScraper
from lmedge.processes import configure_logging, stop_on_signals
from lmedge.processes.plugins import register_plugins
from lmedge.store import RunInfo, Store, StoreOptions, open_store

__all__ = ["ControllerSettings", "OperatorThread", "main", "run_controller"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ControllerSettings:
    """What one controller replica runs.

    `lease_namespace` holds the leader Lease (the controller's own namespace).
    `slots` bounds the run (None: until stopped). `operator` runs kopf too
    (off only where an operator already runs, e.g. tests of the loop).
    """

    backend: KubernetesSettings
    policy: PolicyChoice = field(default_factory=lambda: PolicyChoice(profile=DEFAULT_PROFILE))
    lease_namespace: str = "lmedge-system"
    lease_name: str = "lmedge-controller"
    identity: str | None = None
    seed: int = 0
    slots: int | None = None
    operator: bool = True
    lease_duration_s: float = 15.0
    #: Serve the control plane's Prometheus metrics on this port (None: not at all).
    metrics_port: int | None = None

    def run_config(self) -> RunConfig:
        """The run's `RunConfig`: the loop constants, the policy and its seed.

        Stored with the run; node agents and gateways read it from there, so
        this replica's flags are the only place these settings are given.
        """
        return RunConfig(loop=self.backend.loop, policy=self.policy.config(self.seed))


class OperatorThread:
    """The kopf operator in a background thread with its own event loop."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kopf", daemon=True)
        self.ready = threading.Event()
        self.error: BaseException | None = None

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        import kopf

        import lmedge.operator.handlers  # noqa: F401  (registers the handlers)

        try:
            # kopf accepts threading events as its stop and ready flags.
            asyncio.run(
                kopf.operator(
                    clusterwide=True, standalone=True, stop_flag=self._stop, ready_flag=self.ready
                )
            )
        except BaseException as exc:  # reported to the process, which exits
            self.error = exc

    def stop(self, timeout: float = 30.0) -> None:
        self._stop.set()
        self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()


def remote_deployers(plugins: PolicyPlugins) -> PolicyPlugins:
    """The same planner and router, with the deployers left to the node agents.

    (`build_plugins(..., deployers_in_process=False)` builds this directly and
    refuses a profile whose deployer cannot run apart from its router.)
    """
    return PolicyPlugins(plugins.name, plugins.planner, plugins.router, {})


def _stored_run(store: Store | None, run_id: str) -> RunInfo | None:
    """The cluster run `run_id` as stored, when a replica before this one started it."""
    if store is None:
        return None
    try:
        found = store.run(run_id)
    except LmedgeError as exc:  # no store yet, or it is down: a fresh run
        log.warning("run %s not read from the store (%s); starting it afresh", run_id, exc)
        return None
    return found if found is not None and found.backend == "kubernetes" else None


def _resume_policy(loop: ControlLoop, store: Store | None, run_id: str, slot: int) -> None:
    """Give `loop` the run's newest stored macro policy, to use until the next epoch."""
    found = store.decisions(agent="planner", run=run_id, limit=1) if store else []
    macro = found[0].value if found else None
    if isinstance(macro, MacroPolicy) and loop.resume(macro):
        log.info(
            "run %s resumed at slot %d with the policy of slot %d", run_id, slot, found[0].slot
        )
    else:
        log.warning(
            "run %s resumed at slot %d without a stored policy that fits the cluster; "
            "fallback routing until the next epoch's plan",
            run_id,
            slot,
        )


def _metrics(port: int | None, store: Store | None) -> ControlPlaneMetrics | None:
    """The controller's metrics, served on `port` (None: no metrics)."""
    if port is None:
        return None
    metrics = ControlPlaneMetrics(store_stats=store.buffer_stats if store is not None else None)
    metrics.serve(port)
    log.info("metrics on :%d/metrics", port)
    return metrics


def run_controller(
    settings: ControllerSettings,
    kube: KubeClient,
    store: Store | None,
    stop: threading.Event | None = None,
    on_slot: Callable[[int], None] | None = None,
) -> int:
    """Lead, then operate and run the loop until `stop`, the slot budget or a lost Lease.

    Returns the process exit code: 0 after a clean stop, 1 when leadership
    was lost or the operator died. The plugin catalog must be filled
    (`register_plugins`, as `main` does).
    """
    stop = stop or threading.Event()
    elector = LeaseElector(
        kube,
        settings.lease_namespace,
        settings.lease_name,
        settings.identity,
        duration_s=settings.lease_duration_s,
        renew_s=settings.lease_duration_s / 3,
    )
    if not elector.acquire(stop):
        return 0
    operator = OperatorThread() if settings.operator else None
    code = 0
    try:
        if operator is not None:
            operator.start()
        run_id = settings.backend.run or f"k8s-{datetime.now(UTC):%Y%m%d-%H%M%S}"
        resumed = _stored_run(store, run_id) if settings.backend.run else None
        # A replica taking over a run keeps its clock: the node agents and the
        # gateways anchor their slots on the run's stored start.
        clock = WallClock(resumed.started.replace(tzinfo=UTC).timestamp() if resumed else None)
        backend_settings = KubernetesSettings(**{**settings.backend.__dict__, "run": run_id})
        # The token engines' telemetry in every snapshot, as the node agents read it; a
        # silent pod may hold the slot's snapshot for at most a quarter of the slot.
        engines = EngineScraper(
            timeout_s=min(EngineScraper.timeout_s, backend_settings.loop.slot_s / 4),
            clock=clock.now,
            budget_s=backend_settings.loop.slot_s / 4,
        )
        backend = KubernetesBackend(
            kube, backend_settings, store=store, clock=clock, engines=engines
        )
        plugins = build_plugins(
            settings.policy, backend.context(), settings.seed, deployers_in_process=False
        )
        if store is not None and resumed is None:
            started = datetime.fromtimestamp(clock.start, UTC)
            store.record_run(
                RunInfo(
                    id=run_id,
                    scenario="kubernetes",
                    policy=plugins.name,
                    seed=None,
                    started=started,
                    backend="kubernetes",
                    config=settings.run_config(),
                )
            )
        # A controller runs for weeks: no per-request history in memory, and the
        # planner beside the slot loop so that no slot waits for it.
        loop = ControlLoop(
            backend,
            plugins,
            run_id=run_id,
            seed=settings.seed,
            store=store,
            keep_history=False,
            store_records=False,  # the gateways stored them; the loop reads them back
            background_planning=True,
            metrics=_metrics(settings.metrics_port, store),
        )
        log.info("controller leading run %s with %s", run_id, plugins.name)
        first = 0
        if resumed is not None:
            first = clock.slot(backend_settings.loop.slot_s) + 1
            _resume_policy(loop, store, run_id, first)
            clock.sleep_until(first * backend_settings.loop.slot_s)
        slot = first
        try:
            with quiet_gc():  # the objects set up so far are never walked again
                while not stop.is_set() and (
                    settings.slots is None or slot - first < settings.slots
                ):
                    if elector.lost.is_set():
                        log.error("leadership lost; stopping")
                        code = 1
                        break
                    if operator is not None and not operator.alive:
                        log.error("the operator stopped: %s", operator.error)
                        code = 1
                        break
                    loop.step(slot)
                    if on_slot is not None:
                        on_slot(slot)
                    slot += 1
        finally:
            loop.close()
            backend.close()
    finally:
        if operator is not None:
            operator.stop()
        elector.release()
    return code


def with_worker_gateways(kube: KubeClient, backend: KubernetesSettings) -> KubernetesSettings:
    """`backend` with the gateway of every worker there now, from `gateway_url_template`.

    A gateway given by name (`gateways`) wins over the template. Reading the
    cluster here also makes an unreachable API server an error at start.
    """
    ctx, _ = load_context(kube, KubernetesSettings(namespace=backend.namespace))
    urls = dict(backend.gateways)
    if backend.gateway_url_template:
        for node in ctx.workers:
            urls.setdefault(node.name, backend.gateway_url_template.format(node=node.name))
    return dataclasses.replace(backend, gateways=urls)


def main(settings: ControllerSettings, *, kubeconfig: Path | None, store: str | None) -> int:
    """The `lmedge controller` process: connect, then lead and run until SIGTERM/SIGINT.

    `kubeconfig` None: in-cluster, else `$KUBECONFIG` or `~/.kube/config`;
    `store` None: `$LMEDGE_STORE`, else `./.lmedge/store`. Returns the exit
    code of `run_controller`.
    """
    configure_logging()
    register_plugins()
    settings.run_config()  # an unknown policy name is one error line before anything connects
    kube = KubeClient.connect(kubeconfig)
    try:
        settings = dataclasses.replace(
            settings, backend=with_worker_gateways(kube, settings.backend)
        )
        # The slot's writes must not delay the next routing push: sent from a thread.
        opened = open_store(store, options=StoreOptions(background_flush=True))
        try:
            opened.check_spill_dir()  # records of an outage must have somewhere to go
            return run_controller(settings, kube, opened, stop=stop_on_signals())
        finally:
            opened.close()
    finally:
        kube.close()
