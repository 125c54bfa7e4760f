"""`lmedge controller` and `lmedge node-agent`: the two control-plane processes of a cluster.

Both read their settings from flags (the Helm chart sets them from its values;
there is no settings CRD). The run's configuration — slot length, epoch, tau,
lambda, the policy with its plugin parameters and seed (`RunConfig`) — is
given to the controller only, which stores it with the run; every node agent
reads it, with the run and the slot clock's anchor, from the store. Giving a
node agent one of those flags is a one-line error naming where it belongs.

Each command parses and checks its flags and calls its process's root:
`lmedge.processes.controller.main` and `lmedge.processes.node_agent.main`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated

import typer

from lmedge.api.constants import EPOCH_SLOTS, LAMBDA, SLOT_S, TAU_S
from lmedge.api.runconfig import DEFAULT_PROFILE
from lmedge.api.runconfig import parse_run_config as run_config
from lmedge.cli.simulate import _plugin_params
from lmedge.errors import ConfigError

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
        help=f"Policy profile (default {DEFAULT_PROFILE}): ma, mal, rr, rf, ll, al, perllm, "
        "milp, ...",
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


def _refuse_run_flags(given: Mapping[str, object]) -> None:
    """A retired node-agent flag that was given is a one-line error naming its new home."""
    named = [flag for flag, value in given.items() if value is not None]
    if named:
        raise ConfigError(
            f"{', '.join(named)}: not a node-agent flag any more; the run's configuration "
            "is set on `lmedge controller` and read from the store"
        )


def _gateways(values: list[str] | None, template: str | None) -> dict[str, str]:
    """The gateways named with `--gateway` (the root adds each worker's from the template)."""
    from lmedge.cli.dataplane import parse_pairs

    urls = parse_pairs(values or [], "--gateway")
    if template and "{node}" not in template:
        raise ConfigError(f"--gateway-url-template must contain {{node}}, got {template!r}")
    return urls


def _token_file(path: Path | None) -> Path | None:
    """`path`, checked now: a missing or empty token file is a one-line error at start."""
    if path is not None:
        from lmedge.cli.dataplane import read_secret

        read_secret(path, "--control-token-file")
    return path


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
        from lmedge.backends.kubernetes.backend import KubernetesSettings
        from lmedge.controller.assembly import PolicyChoice
        from lmedge.processes import controller as root

        params = _plugin_params(planner=planner_param, router=router_param, deployer=deployer_param)
        choice = PolicyChoice(profile, planner, router, deployer, params)
        # Bad values are one-line errors before anything starts (bad names: in the root,
        # once the plugins are registered, before it connects).
        config = run_config(
            {"loop": {"slot_s": slot_s, "epoch_slots": epoch_slots, "tau_s": tau, "lam": lam}},
            names=CONTROLLER_FLAGS,
        )  # fmt: skip
        backend = KubernetesSettings(
            namespace=namespace,
            loop=config.loop,
            gateways=_gateways(gateway, gateway_url_template),
            gateway_url_template=gateway_url_template,
            control_token=_token_file(control_token_file),
            run=run,
        )
        settings = root.ControllerSettings(
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
        raise typer.Exit(root.main(settings, kubeconfig=kubeconfig, store=store))

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
        from lmedge.processes import node_agent as root

        _refuse_run_flags(
            {"--slot-s": slot_s, "--policy": profile, "--deployer": deployer, "--seed": seed}
        )
        if token_file is not None and not token_file.is_file():
            raise ConfigError(f"--token-file {token_file} does not exist")
        if progress_root is not None and not progress_root.is_dir():
            raise ConfigError(f"--progress-root {progress_root} is not a directory")
        settings = root.NodeAgentSettings(
            node=node,
            namespace=namespace,
            gateway=gateway,
            control_token_file=_token_file(control_token_file) if gateway else None,
            run=run,
            slots=slots,
            model_service_account=model_service_account,
            progress_root=progress_root,
            exporter_host=exporter_host,
            metrics_port=metrics_port,
        )
        root.main(settings, kubeconfig=kubeconfig, token_file=token_file, store=store)
