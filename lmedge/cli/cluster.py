"""`lmedge controller` and `lmedge node-agent`: the two control-plane processes of a cluster.

Both read their settings from flags (the Helm chart sets them from its values;
there is no settings CRD). The run's configuration — slot length, epoch, tau,
lambda, the policy with its plugin parameters and seed (`RunConfig`) — is
given to the controller only, which stores it with the run; every node agent
reads it, with the run and the slot clock's anchor, from the store. Giving a
node agent one of those flags is a one-line error naming where it belongs.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from lmedge.api.constants import EPOCH_SLOTS, LAMBDA, SLOT_S, TAU_S
from lmedge.api.runconfig import DEFAULT_PROFILE, RunConfig
from lmedge.api.runconfig import parse_run_config as run_config
from lmedge.cli.simulate import _plugin_params
from lmedge.errors import ConfigError, LmedgeError

if TYPE_CHECKING:
    from lmedge.backends.kubernetes.client import KubeClient
    from lmedge.controller.prometheus import ControlPlaneMetrics
    from lmedge.store import RunInfo, Store

Namespace = Annotated[str, typer.Option(help="Namespace of the LMServices and their model pods.")]
Kubeconfig = Annotated[
    Path | None,
    typer.Option(help="Kubeconfig (default: in-cluster, else $KUBECONFIG or ~/.kube/config)."),
]
StoreOpt = Annotated[
    str | None, typer.Option(help="Store URI (default $LMEDGE_STORE or ./.lmedge/store).")
]
SlotS = Annotated[float, typer.Option(help="Slot length, seconds (paper: 30).")]
ControlTokenFile = Annotated[
    Path | None,
    typer.Option(
        envvar="LMEDGE_CONTROL_TOKEN_FILE",
        help="File holding the bearer token for the gateways' /control/* (in a pod: the "
        "projected service-account token; re-read when it rotates).",
    ),
]
Profile = Annotated[
    str,
    typer.Option(
        "--policy",
        "-p",
        help="Policy profile (default ma): ma, mal, rr, rf, ll, al, perllm, milp, ...",
    ),
]


PluginParam = Annotated[
    list[str] | None,
    typer.Option(
        help="Plugin parameter KEY=VALUE of that tier; repeatable. Stored with the run's "
        "configuration (deployer parameters reach every node agent): no secrets here."
    ),
]
#: A setting of the run's configuration that a node agent no longer takes.
Retired = Annotated[str | None, typer.Option(hidden=True)]
#: The controller flag that sets each `RunConfig` field (for error messages).
CONTROLLER_FLAGS = {
    "loop.slot_s": "--slot-s",
    "loop.epoch_slots": "--epoch-slots",
    "loop.tau_s": "--tau",
    "loop.lam": "--lam",
    "policy.seed": "--seed",
}
#: How often a node agent looks for the controller's run while waiting, seconds.
RUN_POLL_S = 2.0


def _refuse_run_flags(given: Mapping[str, object]) -> None:
    """A retired node-agent flag that was given is a one-line error naming its new home."""
    named = [flag for flag, value in given.items() if value is not None]
    if named:
        raise ConfigError(
            f"{', '.join(named)}: not a node-agent flag any more; the run's configuration "
            "is set on `lmedge controller` and read from the store"
        )


def await_run(
    store: Store, run: str, stop: threading.Event, poll_s: float = RUN_POLL_S
) -> RunInfo | None:
    """The run `run` (or, when empty, the newest cluster run) once the controller stored it.

    Waits, polling every `poll_s`, until it appears or `stop` is set (None).
    A node agent started before the controller must not pick a stale run's
    configuration or the defaults: it waits for the run it will serve.
    """
    log = logging.getLogger(__name__)
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


def _serve_run(
    found: RunInfo,
    *,
    node: str,
    namespace: str,
    kube: KubeClient,
    store: Store,
    stop: threading.Event,
    slots: int | None,
    gateway: str | None,
    control_token_file: Path | None,
    model_service_account: str | None,
    progress_root: Path | None,
    exporter_host: str | None,
    metrics: ControlPlaneMetrics | None,
    follow: bool,
) -> str | None:
    """Serve `found` as this node's agent until stopped; the newer run's id when `follow`
    saw the controller start one (None otherwise)."""
    from lmedge.backends.kubernetes.backend import (
        KubernetesBackend,
        KubernetesSettings,
        WallClock,
    )
    from lmedge.backends.kubernetes.gateways import GatewayClient
    from lmedge.controller.assembly import PolicyChoice, build_node_deployer
    from lmedge.nodeagent.agent import NodeAgent, newer_run

    run, start = found.id, found.started.replace(tzinfo=UTC).timestamp()
    config = found.config or RunConfig()
    choice = PolicyChoice.of(config.policy)
    name = choice.resolve().deployer
    gateways = GatewayClient({node: gateway}, _token_file(control_token_file)) if gateway else None
    backend = KubernetesBackend(
        kube,
        KubernetesSettings(
            namespace=namespace,
            loop=config.loop,
            run=run,
            model_service_account=model_service_account,
            progress_root=progress_root,
        ),
        store=store,
        clock=WallClock(start),
        gateways=gateways,
    )
    try:
        plugin = build_node_deployer(choice, backend.context(), node, config.policy.seed)
        collector = None
        if exporter_host:
            from lmedge.nodeagent.telemetry import ExporterTargets, TelemetryCollector

            has_gpu = backend.context().node(node).spec.has_gpu
            collector = TelemetryCollector(
                [ExporterTargets.for_host(node, exporter_host, gpu=has_gpu)],
                run=run,
                clock=backend.wall_clock.now,
            )
        agent = NodeAgent(node, backend, plugin, store=store, telemetry=collector)
        logging.getLogger(__name__).info(
            "node agent on %s: deployer %s, run %s, started %s",
            node, name, run,
            datetime.fromtimestamp(backend.wall_clock.start, UTC).isoformat(),
        )  # fmt: skip
        return agent.run(
            slots=slots,
            stop=stop,
            on_slot=(lambda r: metrics.observe_decisions([r.decision])) if metrics else None,
            superseded=(lambda: newer_run(store, found)) if follow else None,
        )
    finally:
        backend.close()


def _gateways(values: list[str] | None, template: str | None, nodes: list[str]) -> dict[str, str]:
    from lmedge.cli.dataplane import parse_pairs

    urls = parse_pairs(values or [], "--gateway")
    if template:
        if "{node}" not in template:
            raise ConfigError(f"--gateway-url-template must contain {{node}}, got {template!r}")
        for node in nodes:
            urls.setdefault(node, template.format(node=node))
    return urls


def _token_file(path: Path | None) -> Path | None:
    """`path`, checked now: a missing or empty token file is a one-line error at start."""
    if path is not None:
        from lmedge.cli.dataplane import read_secret

        read_secret(path, "--control-token-file")
    return path


def _stop_on_signals() -> threading.Event:
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    return stop


MetricsPort = Annotated[
    int | None,
    typer.Option(
        min=1,
        max=65535,
        help="Serve this process's Prometheus metrics (agents' decisions, slot clock, store "
        "buffer) on this port; unset: none.",
    ),
]


def register(app: typer.Typer) -> None:
    @app.command("controller")
    def controller(
        namespace: Namespace = "default",
        profile: Profile = DEFAULT_PROFILE,
        planner: Annotated[str | None, typer.Option(help="Override the profile's planner.")] = None,
        router: Annotated[str | None, typer.Option(help="Override the profile's router.")] = None,
        deployer: Annotated[
            str | None, typer.Option(help="Override the profile's deployer (node agents run it).")
        ] = None,
        planner_param: PluginParam = None,
        router_param: PluginParam = None,
        deployer_param: PluginParam = None,
        slot_s: SlotS = SLOT_S,
        epoch_slots: Annotated[
            int, typer.Option(help="Slots per epoch (paper: 50).")
        ] = EPOCH_SLOTS,
        tau: Annotated[float, typer.Option(help="Request deadline tau, seconds.")] = TAU_S,
        lam: Annotated[float, typer.Option(help="Objective weight lambda in [0, 1].")] = LAMBDA,
        gateway: Annotated[
            list[str] | None,
            typer.Option("--gateway", help="A node's gateway, NODE=URL; repeat per node."),
        ] = None,
        gateway_url_template: Annotated[
            str | None,
            typer.Option(help="Gateway URL of every worker, e.g. http://{node}.lmedge-gw:8080."),
        ] = None,
        control_token_file: ControlTokenFile = None,
        store: StoreOpt = None,
        kubeconfig: Kubeconfig = None,
        lease_namespace: Annotated[
            str, typer.Option(help="Namespace of the leader-election Lease.")
        ] = "lmedge-system",
        lease_name: Annotated[str, typer.Option(help="Name of the leader-election Lease.")] = (
            "lmedge-controller"
        ),
        identity: Annotated[
            str | None, typer.Option(envvar="POD_NAME", help="This replica's Lease identity.")
        ] = None,
        run: Annotated[str, typer.Option(help="Run id (default k8s-<start time>).")] = "",
        slots: Annotated[int | None, typer.Option(help="Stop after this many slots.")] = None,
        seed: Annotated[int, typer.Option(min=0, help="Seed of the randomized plugins.")] = 0,
        operator: Annotated[
            bool, typer.Option(help="Also run the kopf operator (EdgeNode/LMService).")
        ] = True,
        metrics_port: MetricsPort = None,
    ) -> None:
        """Run the controller: leader election, operator, planner and scheduler loop."""
        from lmedge.backends.kubernetes.backend import KubernetesSettings, load_context
        from lmedge.backends.kubernetes.client import KubeClient
        from lmedge.controller.assembly import PolicyChoice
        from lmedge.operator.process import ControllerSettings, run_controller
        from lmedge.store import open_store

        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
        params = _plugin_params(planner=planner_param, router=router_param, deployer=deployer_param)
        choice = PolicyChoice(profile, planner, router, deployer, params)
        # Bad values or names are one-line errors before anything starts.
        config = run_config(
            {"loop": {"slot_s": slot_s, "epoch_slots": epoch_slots, "tau_s": tau, "lam": lam},
             "policy": choice.config(seed)},
            names=CONTROLLER_FLAGS,
        )  # fmt: skip
        kube = KubeClient.connect(kubeconfig)
        base = KubernetesSettings(namespace=namespace)
        ctx, _ = load_context(kube, base)
        backend = KubernetesSettings(
            namespace=namespace,
            loop=config.loop,
            gateways=_gateways(gateway, gateway_url_template, [n.name for n in ctx.workers]),
            gateway_url_template=gateway_url_template,
            control_token=_token_file(control_token_file),
            run=run,
        )
        settings = ControllerSettings(
            backend=backend,
            policy=choice,
            lease_namespace=lease_namespace,
            lease_name=lease_name,
            identity=identity,
            seed=seed,
            slots=slots,
            operator=operator,
            metrics_port=metrics_port,
        )
        opened = open_store(store)
        try:
            code = run_controller(settings, kube, opened, stop=_stop_on_signals())
        finally:
            opened.close()
            kube.close()
        raise typer.Exit(code)

    @app.command("node-agent")
    def node_agent(
        node: Annotated[
            str, typer.Option(envvar="NODE_NAME", help="This node (its EdgeNode's name).")
        ],
        namespace: Namespace = "default",
        profile: Annotated[str | None, typer.Option("--policy", "-p", hidden=True)] = None,
        deployer: Retired = None,
        slot_s: Annotated[float | None, typer.Option(hidden=True)] = None,
        gateway: Annotated[
            str | None, typer.Option(help="This node's gateway URL (model pods are pushed there).")
        ] = None,
        control_token_file: ControlTokenFile = None,
        store: StoreOpt = None,
        kubeconfig: Kubeconfig = None,
        token_file: Annotated[
            Path | None,
            typer.Option(help="Bearer token file replacing the kubeconfig's credentials."),
        ] = None,
        run: Annotated[
            str,
            typer.Option(help="Run id (default: the newest cluster run in the store, waited for)."),
        ] = "",
        slots: Annotated[int | None, typer.Option(help="Stop after this many slots.")] = None,
        seed: Annotated[int | None, typer.Option(hidden=True)] = None,
        model_service_account: Annotated[
            str | None,
            typer.Option(
                help="Service account of the model pods (the chart's <release>-model, which "
                "has no permissions); default: the namespace's `default`."
            ),
        ] = None,
        progress_root: Annotated[
            Path | None,
            typer.Option(
                help="Where this process sees the host's /var/lib/lmedge/progress: each LM's "
                "directory is created there, writable by the model server, before its pod."
            ),
        ] = None,
        exporter_host: Annotated[
            str | None,
            typer.Option(
                envvar="LMEDGE_EXPORTER_HOST",
                help=(
                    "Host whose node-exporter (:9100) and, on GPU nodes, dcgm-exporter "
                    "(:9400) the agent scrapes each slot into the store; unset: no telemetry."
                ),
            ),
        ] = None,
        metrics_port: MetricsPort = None,
    ) -> None:
        """Run this node's agent: its Deployment Agent each slot, and the actuation."""
        from lmedge.backends.kubernetes.client import KubeClient
        from lmedge.store import open_store

        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
        _refuse_run_flags(
            {"--slot-s": slot_s, "--policy": profile, "--deployer": deployer, "--seed": seed}
        )
        if token_file is not None and not token_file.is_file():
            raise ConfigError(f"--token-file {token_file} does not exist")
        if progress_root is not None and not progress_root.is_dir():
            raise ConfigError(f"--progress-root {progress_root} is not a directory")
        stop = _stop_on_signals()
        # A bad kubeconfig or store is a one-line error now, not after the wait.
        kube = KubeClient.connect(kubeconfig, token_file=token_file)
        opened = open_store(store)
        # Without --run the agent serves the newest cluster run, and follows the
        # controller to a newer one (a restarted controller starts a new run):
        # it rebuilds everything from that run's stored configuration.
        follow = not run
        metrics = None
        if metrics_port is not None:
            from lmedge.controller.prometheus import ControlPlaneMetrics

            metrics = ControlPlaneMetrics(store_stats=opened.buffer_stats)
            metrics.serve(metrics_port)
        try:
            wanted = run
            while True:
                found = await_run(opened, wanted, stop)
                if found is None:  # stopped while waiting for the controller
                    return
                newer = _serve_run(
                    found,
                    node=node,
                    namespace=namespace,
                    kube=kube,
                    store=opened,
                    stop=stop,
                    slots=slots,
                    gateway=gateway,
                    control_token_file=control_token_file,
                    model_service_account=model_service_account,
                    progress_root=progress_root,
                    exporter_host=exporter_host,
                    metrics=metrics,
                    follow=follow,
                )
                if newer is None:
                    return
                logging.getLogger(__name__).info(
                    "node agent on %s: the controller started run %s; following it (was %s)",
                    node, newer, found.id,
                )  # fmt: skip
                wanted = newer
        finally:
            opened.close()
            kube.close()
