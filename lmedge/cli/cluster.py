"""`lmedge controller` and `lmedge node-agent`: the two control-plane processes of a cluster.

Both read their settings from flags (the Helm chart sets them from its values;
there is no settings CRD). The controller and every node agent must agree on
`--slot-s` and the store: the agents find the controller's current run, and
the slot clock's anchor, in the store.
"""

from __future__ import annotations

import logging
import math
import signal
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer

from lmedge.errors import ConfigError, StoreError

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


def register(app: typer.Typer) -> None:
    @app.command("controller")
    def controller(
        namespace: Namespace = "default",
        profile: Profile = "ma",
        planner: Annotated[str | None, typer.Option(help="Override the profile's planner.")] = None,
        router: Annotated[str | None, typer.Option(help="Override the profile's router.")] = None,
        slot_s: SlotS = 30.0,
        epoch_slots: Annotated[int, typer.Option(help="Slots per epoch (paper: 50).")] = 50,
        tau: Annotated[float, typer.Option(help="Request deadline tau, seconds.")] = 900.0,
        lam: Annotated[float, typer.Option(help="Objective weight lambda in [0, 1].")] = 0.5,
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
    ) -> None:
        """Run the controller: leader election, operator, planner and scheduler loop."""
        from lmedge.backends.kubernetes.backend import KubernetesSettings, load_context
        from lmedge.backends.kubernetes.client import KubeClient
        from lmedge.controller.assembly import PolicyChoice
        from lmedge.operator.process import ControllerSettings, run_controller
        from lmedge.store import open_store

        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
        if not 0 <= lam <= 1:
            raise ConfigError(f"--lam must be in [0, 1], got {lam}")
        # `not x > 0` also refuses nan; inf is no slot length either.
        if not 0 < slot_s < math.inf or not 0 < tau < math.inf or epoch_slots < 1:
            raise ConfigError(
                "--slot-s and --tau must be positive and finite, --epoch-slots at least 1"
            )
        choice = PolicyChoice(profile=profile, planner=planner, router=router)
        choice.resolve()  # a bad name is a one-line error before anything starts
        kube = KubeClient.connect(kubeconfig)
        base = KubernetesSettings(namespace=namespace)
        ctx, _ = load_context(kube, base)
        backend = KubernetesSettings(
            namespace=namespace,
            slot_s=slot_s,
            epoch_slots=epoch_slots,
            tau_s=tau,
            lam=lam,
            gateways=_gateways(gateway, gateway_url_template, [n.name for n in ctx.workers]),
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
        profile: Profile = "ma",
        deployer: Annotated[
            str | None, typer.Option(help="Override the profile's deployer.")
        ] = None,
        slot_s: SlotS = 30.0,
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
            str, typer.Option(help="Run id (default: the newest run in the store).")
        ] = "",
        slots: Annotated[int | None, typer.Option(help="Stop after this many slots.")] = None,
        seed: Annotated[int, typer.Option(min=0, help="Seed of a randomized deployer.")] = 0,
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
    ) -> None:
        """Run this node's agent: its Deployment Agent each slot, and the actuation."""
        from lmedge.backends.kubernetes.backend import (
            KubernetesBackend,
            KubernetesSettings,
            WallClock,
        )
        from lmedge.backends.kubernetes.client import KubeClient
        from lmedge.backends.kubernetes.gateways import GatewayClient
        from lmedge.controller.assembly import PolicyChoice, derive_seed
        from lmedge.controller.catalog import BuildContext, build_deployer
        from lmedge.nodeagent.agent import NodeAgent
        from lmedge.store import open_store

        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
        if not 0 < slot_s < math.inf:
            raise ConfigError(f"--slot-s must be positive and finite, got {slot_s}")
        name = PolicyChoice(profile=profile, deployer=deployer).resolve().deployer
        if token_file is not None and not token_file.is_file():
            raise ConfigError(f"--token-file {token_file} does not exist")
        opened = open_store(store)
        start: float | None = None
        if not run:
            try:
                latest = opened.runs(limit=1)[0]
            except StoreError:
                latest = None
            if latest is not None and latest.backend == "kubernetes":
                run, start = latest.id, latest.started.replace(tzinfo=UTC).timestamp()
        kube = KubeClient.connect(kubeconfig, token_file=token_file)
        gateways = (
            GatewayClient({node: gateway}, _token_file(control_token_file)) if gateway else None
        )
        if progress_root is not None and not progress_root.is_dir():
            raise ConfigError(f"--progress-root {progress_root} is not a directory")
        backend = KubernetesBackend(
            kube,
            KubernetesSettings(
                namespace=namespace,
                slot_s=slot_s,
                run=run,
                model_service_account=model_service_account,
                progress_root=progress_root,
            ),
            store=opened,
            clock=WallClock(start),
            gateways=gateways,
        )
        plugin = build_deployer(
            name, BuildContext(backend.context(), derive_seed(seed, f"deployer:{node}"))
        )
        collector = None
        if exporter_host:
            from lmedge.nodeagent.telemetry import ExporterTargets, TelemetryCollector

            has_gpu = backend.context().node(node).spec.has_gpu
            collector = TelemetryCollector(
                [ExporterTargets.for_host(node, exporter_host, gpu=has_gpu)],
                run=run,
                clock=backend.wall_clock.now,
            )
        agent = NodeAgent(node, backend, plugin, store=opened, telemetry=collector)
        logging.getLogger(__name__).info(
            "node agent on %s: deployer %s, run %s, started %s",
            node, name, run or "-",
            datetime.fromtimestamp(backend.wall_clock.start, UTC).isoformat(),
        )  # fmt: skip
        try:
            agent.run(slots=slots, stop=_stop_on_signals())
        finally:
            backend.close()
            opened.close()
            kube.close()
