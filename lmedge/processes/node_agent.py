"""The `lmedge node-agent` process: one node's Deployment Agent and its actuation.

The composition root of a node agent: `main` connects the Kubernetes client
and the store, waits for the run the controller stored (`await_run`), builds
that run's deployer for this node from the run's stored `RunConfig` and runs
the `NodeAgent` (`lmedge.nodeagent.agent`) until stopped. Without a fixed
run it follows the controller to a newer run, rebuilding everything from that
run's configuration. `lmedge node-agent` only parses its flags into
`NodeAgentSettings`; the run's settings are never flags here.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from lmedge.api.runconfig import RunConfig
from lmedge.backends.kubernetes.backend import KubernetesBackend, KubernetesSettings, WallClock
from lmedge.backends.kubernetes.client import KubeClient
from lmedge.backends.kubernetes.gateways import GatewayClient
from lmedge.controller.assembly import PolicyChoice, build_node_deployer
from lmedge.controller.prometheus import ControlPlaneMetrics
from lmedge.errors import LmedgeError
from lmedge.nodeagent.agent import NodeAgent, SlotReport, newer_run
from lmedge.processes import configure_logging, stop_on_signals
from lmedge.processes.plugins import register_plugins
from lmedge.store import RunInfo, Store, open_store

__all__ = ["RUN_POLL_S", "NodeAgentSettings", "await_run", "main", "serve_runs"]

log = logging.getLogger(__name__)

#: How often a node agent looks for the controller's run while waiting, seconds.
RUN_POLL_S = 2.0


@dataclass(frozen=True)
class NodeAgentSettings:
    """What one node agent runs (from its flags; the run's own settings come from the store).

    `run` empty: the newest cluster run, waited for and followed to a newer
    one. `gateway`: this node's gateway URL, with `control_token_file` its
    control credential (None: no data plane). `exporter_host`: where the
    node's exporters are scraped (None: no telemetry). `metrics_port`: serve
    the agent's Prometheus metrics there (None: none).
    """

    node: str
    namespace: str = "default"
    gateway: str | None = None
    control_token_file: Path | None = None
    run: str = ""
    slots: int | None = None
    model_service_account: str | None = None
    progress_root: Path | None = None
    exporter_host: str | None = None
    metrics_port: int | None = None


def await_run(
    store: Store, run: str, stop: threading.Event, poll_s: float = RUN_POLL_S
) -> RunInfo | None:
    """The run `run` (or, when empty, the newest cluster run) once the controller stored it.

    Waits, polling every `poll_s`, until it appears or `stop` is set (None).
    A node agent started before the controller must not pick a stale run's
    configuration or the defaults: it waits for the run it will serve.
    """
    announced = False
    while not stop.is_set():
        try:
            found = store.run(run) if run else store.latest_run(backend="kubernetes")
        except LmedgeError as exc:  # the store is down: wait for it as for the run
            log.warning("no run from the store yet: %s", exc)
            found = None
        if found is not None:
            if found.config is None:
                log.warning("run %s has no stored configuration; using the defaults", found.id)
            return found
        if not announced:
            announced = True
            log.info("waiting for the controller to store %s", f"run {run}" if run else "a run")
        stop.wait(poll_s)
    return None


def observe(metrics: ControlPlaneMetrics, node: str, report: SlotReport) -> None:
    """Count a slot's decision and export the engine telemetry its deployer saw."""
    metrics.observe_decisions([report.decision])
    metrics.observe_engines(node, report.engines)


def _serve_run(
    found: RunInfo,
    settings: NodeAgentSettings,
    *,
    kube: KubeClient,
    store: Store,
    stop: threading.Event,
    metrics: ControlPlaneMetrics | None,
    follow: bool,
) -> str | None:
    """Serve `found` as this node's agent until stopped; the newer run's id when `follow`
    saw the controller start one (None otherwise)."""
    node = settings.node
    run, start = found.id, found.started.replace(tzinfo=UTC).timestamp()
    config = found.config or RunConfig()
    choice = PolicyChoice.of(config.policy)
    name = choice.resolve().deployer
    gateways = (
        GatewayClient({node: settings.gateway}, settings.control_token_file)
        if settings.gateway
        else None
    )
    backend = KubernetesBackend(
        kube,
        KubernetesSettings(
            namespace=settings.namespace,
            loop=config.loop,
            run=run,
            model_service_account=settings.model_service_account,
            progress_root=settings.progress_root,
        ),
        store=store,
        clock=WallClock(start),
        gateways=gateways,
    )
    try:
        plugin = build_node_deployer(choice, backend.context(), node, config.policy.seed)
        collector = None
        if settings.exporter_host:
            from lmedge.nodeagent.telemetry import ExporterTargets, TelemetryCollector

            has_gpu = backend.context().node(node).spec.has_gpu
            collector = TelemetryCollector(
                [ExporterTargets.for_host(node, settings.exporter_host, gpu=has_gpu)],
                run=run,
                clock=backend.wall_clock.now,
            )
        from lmedge.nodeagent.telemetry import EngineScraper

        # The token engines' /metrics are read from the pods themselves: no exporter needed.
        engines = EngineScraper(clock=backend.wall_clock.now)
        agent = NodeAgent(node, backend, plugin, store=store, telemetry=collector, engines=engines)
        log.info(
            "node agent on %s: deployer %s, run %s, started %s",
            node, name, run,
            datetime.fromtimestamp(backend.wall_clock.start, UTC).isoformat(),
        )  # fmt: skip
        return agent.run(
            slots=settings.slots,
            stop=stop,
            on_slot=(lambda r: observe(metrics, node, r)) if metrics else None,
            superseded=(lambda: newer_run(store, found)) if follow else None,
        )
    finally:
        backend.close()


def serve_runs(
    settings: NodeAgentSettings,
    kube: KubeClient,
    store: Store,
    stop: threading.Event,
    metrics: ControlPlaneMetrics | None = None,
) -> None:
    """Serve the run of `settings` (or the newest, following newer ones) until `stop`.

    The plugin catalog must be filled (`register_plugins`, as `main` does).
    """
    # Without a run the agent serves the newest cluster run, and follows the
    # controller to a newer one (a restarted controller starts a new run):
    # it rebuilds everything from that run's stored configuration.
    follow = not settings.run
    wanted = settings.run
    while True:
        found = await_run(store, wanted, stop)
        if found is None:  # stopped while waiting for the controller
            return
        newer = _serve_run(
            found, settings, kube=kube, store=store, stop=stop, metrics=metrics, follow=follow
        )
        if newer is None:
            return
        log.info(
            "node agent on %s: the controller started run %s; following it (was %s)",
            settings.node, newer, found.id,
        )  # fmt: skip
        wanted = newer


def main(
    settings: NodeAgentSettings,
    *,
    kubeconfig: Path | None,
    token_file: Path | None,
    store: str | None,
) -> None:
    """The `lmedge node-agent` process: connect, then serve runs until SIGTERM/SIGINT.

    `token_file` replaces the kubeconfig's credentials (None: keep them);
    `store` None: `$LMEDGE_STORE`, else `./.lmedge/store`.
    """
    configure_logging()
    register_plugins()
    stop = stop_on_signals()
    # A bad kubeconfig or store is a one-line error now, not after the wait.
    kube = KubeClient.connect(kubeconfig, token_file=token_file)
    opened = open_store(store)
    metrics = None
    if settings.metrics_port is not None:
        metrics = ControlPlaneMetrics(store_stats=opened.buffer_stats)
        metrics.serve(settings.metrics_port)
    try:
        serve_runs(settings, kube, opened, stop, metrics)
    finally:
        opened.close()
        kube.close()
