"""The `lmedge gateway` process: one node's data plane under uvicorn.

The composition root of a gateway: `main` binds the socket, builds the
control credential (a shared token, or service-account tokens checked by
TokenReview), the HTTP clients of peers and model pods and the store's
record sink, takes the newest run's deadline from the store, and serves the
framework-free `Gateway` core (`lmedge.dataplane.gateway`) through its app
until SIGTERM, then drains (`lmedge.dataplane.serving.GatewayServer`).
`lmedge gateway` only parses and checks its flags into `GatewaySettings` and
`GatewayOptions`. A gateway builds one policy only when a routing push asks
it to route request by request (`lmedge.dataplane.windows`): the run's
router, from the plugin catalog (`build_gateway_router`) on a window thread,
which fills the catalog then, so a gateway serving a slot map never imports
a policy.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path

import uvicorn

from lmedge.api import ClusterContext, RequestRouter
from lmedge.api.runconfig import PolicyConfig
from lmedge.backends.kubernetes.client import KubeClient
from lmedge.dataplane.app import DEFAULT_MAX_BODY, ApiSettings, create_app
from lmedge.dataplane.auth import (
    ControlAuth,
    ServiceAccountAuth,
    StaticTokenAuth,
    kube_reviewer,
    service_account_username,
)
from lmedge.dataplane.clients import HttpClients
from lmedge.dataplane.gateway import Gateway, GatewaySettings
from lmedge.dataplane.records import StoreSink
from lmedge.dataplane.serving import DEFAULT_DRAIN_S, GatewayServer, bind
from lmedge.errors import ConfigError, LmedgeError
from lmedge.store import Store, open_store

__all__ = ["GatewayOptions", "build_router", "build_seed", "control_auth", "main"]


@dataclass(frozen=True)
class GatewayOptions:
    """How one gateway process listens, authenticates and stores (its flags, checked).

    `token`: the users' bearer token of /v1/* (None: open). The control API
    takes `control_token` (a shared token, outside Kubernetes) or, with
    `control_audience`, the service-account tokens of `controller_account`
    and `agent_account` (NAMESPACE/NAME), verified by TokenReview through
    `kubeconfig`; neither: open. `peer_token_file` is sent to peer gateways
    (re-read when it rotates). `store` None: `$LMEDGE_STORE`, else
    `./.lmedge/store`. `drain_s`: seconds requests may finish after SIGTERM.
    """

    host: str = "127.0.0.1"
    port: int = 8080
    store: str | None = None
    token: str | None = None
    control_token: str | None = None
    control_audience: str | None = None
    controller_account: str | None = None
    agent_account: str | None = None
    kubeconfig: Path | None = None
    peer_token_file: Path | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY
    max_connections: int = 512
    drain_s: float = DEFAULT_DRAIN_S


def control_auth(node: str, options: GatewayOptions) -> ControlAuth | None:
    """The gateway's control credential (module `lmedge.dataplane.auth`); None: open.

    An inconsistent choice (both kinds, or an audience without both accounts)
    is a one-line `ConfigError` naming the flags.
    """
    audience, controller, agent = (
        options.control_audience,
        options.controller_account,
        options.agent_account,
    )
    if options.control_token is not None and audience:
        raise ConfigError("give --control-token-file or --control-audience, not both")
    if options.control_token is not None:
        return StaticTokenAuth(options.control_token)
    if not audience:
        if controller or agent:
            raise ConfigError("--controller-account and --agent-account need --control-audience")
        return None
    if not controller or not agent:
        raise ConfigError("--control-audience needs --controller-account and --agent-account")
    return ServiceAccountAuth(
        node=node,
        reviewer=kube_reviewer(KubeClient.connect(options.kubeconfig)),
        audience=audience,
        controller=service_account_username(controller),
        agent=service_account_username(agent),
    )


def _stored_tau(store: Store, default: float) -> float:
    """The deadline of the newest cluster run in the store (its `RunConfig`), else `default`.

    Until the controller's first routing push (which carries it) the gateway
    already times requests out on the run's tau. A store that does not answer
    leaves the default: the push corrects it within a slot.
    """
    try:
        latest = store.latest_run(backend="kubernetes")
    except LmedgeError as exc:
        logging.getLogger(__name__).warning("no run configuration from the store: %s", exc)
        return default
    return latest.config.loop.tau_s if latest is not None and latest.config is not None else default


def build_router(policy: PolicyConfig, ctx: ClusterContext, node: str) -> RequestRouter:
    """The run's request router for `node` (fills the plugin catalog on first use)."""
    from lmedge.controller.assembly import build_gateway_router
    from lmedge.processes.plugins import register_plugins

    register_plugins()
    return build_gateway_router(policy, ctx, node)


def build_seed(policy: PolicyConfig, ctx: ClusterContext, node: str) -> RequestRouter:
    """The load-aware seed router `node` falls back on (fills the catalog on first use)."""
    from lmedge.controller.assembly import build_seed_router
    from lmedge.processes.plugins import register_plugins

    register_plugins()
    return build_seed_router(policy, ctx, node)


def main(settings: GatewaySettings, options: GatewayOptions) -> None:
    """The `lmedge gateway` process: serve `settings`' node until SIGTERM, then drain."""
    # Bound before the store and clients open: a port it cannot use is one error line.
    sock = bind(options.host, options.port)
    # Checked before anything opens: a user token never doubles as the control one.
    api_settings = ApiSettings(
        token=options.token,
        control_auth=control_auth(settings.node, options),
        max_body_bytes=options.max_body_bytes,
    )
    clients = HttpClients(token=options.peer_token_file, max_connections=options.max_connections)
    opened = open_store(options.store)
    sink = StoreSink(opened)
    settings = dataclasses.replace(settings, tau_s=_stored_tau(opened, settings.tau_s))
    core = Gateway(
        settings,
        peers=clients,
        models=clients,
        sink=sink,
        build_router=build_router,
        build_seed=build_seed,
    )
    api = create_app(core, api_settings)
    api.state.closers.append(clients.aclose)
    config = uvicorn.Config(api, log_level="warning", backlog=4096)
    GatewayServer(config, core, options.drain_s).run(sockets=[sock])
