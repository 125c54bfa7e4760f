"""`lmedge gateway` and `lmedge model-server`: the two data-plane processes of a node.

The gateway is assembled in `lmedge.processes.gateway`; its command here
parses and checks the flags and calls that root.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, cast, get_args

import typer

from lmedge.errors import ConfigError

#: Default largest request body of the gateway, bytes (as in lmedge.dataplane.app).
DEFAULT_MAX_BODY = 32 * 1024 * 1024


def parse_pairs(values: list[str], what: str) -> dict[str, str]:
    """`NAME=VALUE` flags as a dict; one clear error for a malformed or repeated one."""
    pairs: dict[str, str] = {}
    for value in values:
        name, sep, rest = value.partition("=")
        if not sep or not name.strip() or not rest.strip():
            raise ConfigError(f"{what} must look like NAME=URL, got {value!r}")
        if name in pairs:
            raise ConfigError(f"{what} for {name!r} given twice")
        pairs[name.strip()] = rest.strip()
    return pairs


def read_secret(path: Path, what: str) -> str:
    """A token from a file (stripped); one clear error when unreadable or empty."""
    try:
        text = path.read_text().strip()
    except OSError as exc:
        raise ConfigError(f"{what} {path}: {exc.strerror or exc}") from exc
    if not text:
        raise ConfigError(f"{what} {path} is empty")
    return text


def register(app: typer.Typer) -> None:
    @app.command("gateway")
    def gateway(
        node: Annotated[str, typer.Option("--node", help="This node's name (as in its EdgeNode).")],
        services: Annotated[
            Path,
            typer.Option("--services", help="LMService manifests (file or folder) naming the LMs."),
        ],
        host: Annotated[
            str, typer.Option(help="Address to listen on (0.0.0.0 in a pod).")
        ] = "127.0.0.1",
        port: Annotated[int, typer.Option(help="Port to listen on.")] = 8080,
        peer: Annotated[
            list[str] | None,
            typer.Option("--peer", help="Another node's gateway, NODE=URL; repeat per node."),
        ] = None,
        peer_url_template: Annotated[
            str | None,
            typer.Option(
                help="URL of nodes not given with --peer, e.g. http://{node}.lmedge-gateway:8080."
            ),
        ] = None,
        model_url: Annotated[
            list[str] | None,
            typer.Option("--model-url", help="A model pod on this node, LM=URL; repeat per LM."),
        ] = None,
        tau: Annotated[float | None, typer.Option(hidden=True)] = None,
        run: Annotated[
            str, typer.Option(help="Run id stamped on records until the controller sends one.")
        ] = "",
        store: Annotated[
            str | None,
            typer.Option(
                help="Store for request records (default $LMEDGE_STORE or ./.lmedge/store)."
            ),
        ] = None,
        max_body_bytes: Annotated[
            int, typer.Option(help="Largest request body, bytes.")
        ] = DEFAULT_MAX_BODY,
        drain_s: Annotated[
            float,
            typer.Option(
                help="After SIGTERM, seconds requests may still finish before every set "
                "still waiting is answered as timed out (and recorded); keep it below the "
                "pod's terminationGracePeriodSeconds."
            ),
        ] = 20.0,
        max_connections: Annotated[
            int, typer.Option(help="Pooled connections per upstream pool.")
        ] = 512,
        token_file: Annotated[
            Path | None,
            typer.Option(
                envvar="LMEDGE_GATEWAY_TOKEN_FILE",
                help="File holding the users' bearer token of /v1/*; unset: the user API is open.",
            ),
        ] = None,
        control_token_file: Annotated[
            Path | None,
            typer.Option(
                envvar="LMEDGE_CONTROL_TOKEN_FILE",
                help="File holding a shared control token of /control/* and /internal/forward "
                "(outside Kubernetes; in a cluster use --control-audience).",
            ),
        ] = None,
        control_audience: Annotated[
            str | None,
            typer.Option(
                help="Accept on /control/* the callers' service-account tokens for this "
                "audience, verified by TokenReview: the controller's account, or the node "
                "agents' account bound to a pod on this node (any node for /internal/forward).",
            ),
        ] = None,
        controller_account: Annotated[
            str | None,
            typer.Option(help="The controller's service account, NAMESPACE/NAME."),
        ] = None,
        agent_account: Annotated[
            str | None,
            typer.Option(help="The node agents' service account, NAMESPACE/NAME."),
        ] = None,
        peer_token_file: Annotated[
            Path | None,
            typer.Option(
                help="File holding the bearer token sent to peer gateways (re-read when it "
                "changes; default: --control-token-file)."
            ),
        ] = None,
        kubeconfig: Annotated[
            Path | None,
            typer.Option(help="Kubeconfig for TokenReview (default: in-cluster, $KUBECONFIG)."),
        ] = None,
    ) -> None:
        """Run this node's gateway: user API, forwarding, per-LM queues, /metrics."""
        from lmedge.api.manifests import load_resources
        from lmedge.dataplane.gateway import GatewaySettings, request_classes
        from lmedge.dataplane.serving import check_urls
        from lmedge.processes import gateway as root

        if tau is not None:
            raise ConfigError(
                "--tau is no longer a gateway flag: the deadline is the run's "
                "(`lmedge controller --tau`), read from the store and sent with each routing push"
            )
        if not 0 <= drain_s < math.inf:
            raise ConfigError(f"--drain-s must be >= 0 and finite, got {drain_s:g}")
        _, found = load_resources(services)
        if not found:
            raise ConfigError(f"{services}: no LMService found")
        settings = GatewaySettings(
            node=node,
            services={s.name: s.spec.modality for s in found},
            classes=request_classes(found),
            peers=parse_pairs(peer or [], "--peer"),
            peer_url_template=peer_url_template,
            model_urls=parse_pairs(model_url or [], "--model-url"),
            run=run,
        )
        check_urls(settings)
        peer_token = peer_token_file or control_token_file
        if peer_token is not None:
            read_secret(peer_token, "--peer-token-file")
        options = root.GatewayOptions(
            host=host,
            port=port,
            store=store,
            token=read_secret(token_file, "--token-file") if token_file else None,
            control_token=(
                read_secret(control_token_file, "--control-token-file")
                if control_token_file
                else None
            ),
            control_audience=control_audience,
            controller_account=controller_account,
            agent_account=agent_account,
            kubeconfig=kubeconfig,
            peer_token_file=peer_token,
            max_body_bytes=max_body_bytes,
            max_connections=max_connections,
            drain_s=drain_s,
        )
        root.main(settings, options)

    @app.command("model-server")
    def model_server(
        lm: Annotated[str, typer.Option("--lm", help="The LM service this pod serves.")],
        modality: Annotated[
            str, typer.Option(help="The LM's modality: text-to-text, image-to-text, text-to-image.")
        ] = "text-to-text",
        backend: Annotated[
            str, typer.Option(help="stub, text-generation, image-to-text or text-to-image.")
        ] = "stub",
        model_path: Annotated[
            Path | None, typer.Option(help="Directory of local weights (baked into the image).")
        ] = None,
        device: Annotated[str, typer.Option(help="auto, cpu or cuda.")] = "auto",
        progress_dir: Annotated[
            Path, typer.Option(help="Host path for resumable progress (a hostPath volume).")
        ] = Path(".lmedge/progress"),
        host: Annotated[
            str, typer.Option(help="Address to listen on (0.0.0.0 in a pod).")
        ] = "127.0.0.1",
        port: Annotated[int, typer.Option(help="Port to listen on.")] = 8000,
        stub_seconds: Annotated[
            float, typer.Option(help="Stub backend: seconds per prompt.")
        ] = 0.0,
        max_new_tokens: Annotated[
            int, typer.Option(help="Text output: default new tokens per prompt.")
        ] = 32,
        image_steps: Annotated[int, typer.Option(help="Text-to-image: denoising steps.")] = 20,
        image_size: Annotated[int, typer.Option(help="Text-to-image: image side, pixels.")] = 512,
        fsync: Annotated[
            bool,
            typer.Option(
                help="fsync progress after each prompt; without it progress survives a pod "
                "restart but not a node crash."
            ),
        ] = True,
    ) -> None:
        """Run a model pod's server: one LM, /infer with resumable prompt sets."""
        import uvicorn

        from lmedge.api.resources import Modality
        from lmedge.dataplane.serving import bind
        from lmedge.modelserver.app import ModelServer, create_app
        from lmedge.modelserver.backends import load_backend

        if not 0 <= stub_seconds < math.inf:
            raise ConfigError(f"--stub-seconds must be >= 0 and finite, got {stub_seconds:g}")
        kinds = get_args(Modality)
        if modality not in kinds:
            raise ConfigError(f"unknown modality {modality!r}; choose one of {', '.join(kinds)}")
        chosen = load_backend(
            backend,
            lm=lm,
            modality=cast(Modality, modality),
            model_path=model_path,
            device=device,
            stub_seconds=stub_seconds,
            max_new_tokens=max_new_tokens,
            image_steps=image_steps,
            image_size=image_size,
        )
        server = ModelServer(lm, chosen, progress_dir, fsync=fsync)
        sock = bind(host, port)
        uvicorn.Server(uvicorn.Config(create_app(server), log_level="warning")).run(sockets=[sock])
