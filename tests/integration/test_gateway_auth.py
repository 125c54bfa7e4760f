"""The gateway's control credential against the real API server (TokenReview)
and the real `lmedge gateway` CLI.

A gateway on worker-2 accepts on /control/* the controller's service-account
token and the token of the node agent bound to a pod on worker-2 (both with
the gateways' audience), and refuses the node agent of worker-3, unbound
tokens, tokens for another audience, other accounts and the users' API token.
Peers (any node's agent) may forward. The tokens are real: made by the
TokenRequest API for KWOK pods, reviewed by the API server, with the RBAC of
`deploy/rbac/` (the chart's).
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from lmedge.api.gateway_control import ModelEndpoint
from lmedge.backends.kubernetes.client import KubeClient
from lmedge.backends.kubernetes.gateways import GatewayClient
from lmedge.dataplane.app import ApiSettings, create_app
from lmedge.dataplane.auth import ServiceAccountAuth, kube_reviewer
from lmedge.dataplane.clients import HttpClients
from lmedge.dataplane.gateway import Gateway, GatewaySettings
from lmedge.dataplane.records import MemorySink
from tests.fixtures.cluster import REPO, KubeCluster
from tests.fixtures.dataplane import SERVICES, ServerThread
from tests.integration.test_admission import AGENT_SA, CONTROLLER_SA, SYSTEM, install_rbac

AUDIENCE = "lmedge-gateway"
USER_TOKEN = "users-api-token"
MODELS = {"models": [{"lm": "lm1", "url": "http://10.0.0.9:8000"}]}


@pytest.fixture(scope="module")
def admin(lmedge_cluster: KubeCluster) -> Iterator[KubeClient]:
    install_rbac(lmedge_cluster)
    k = KubeClient.connect(lmedge_cluster.kubeconfig)
    yield k
    k.close()


class Tokens:
    """Pod-bound tokens of lmedge's accounts, as the kubelet would project them."""

    def __init__(self, admin: KubeClient) -> None:
        self.admin = admin
        self.pods: list[str] = []

    def bound(self, account: str, node: str, audience: str | None = AUDIENCE) -> str:
        name = f"tok-{uuid.uuid4().hex[:6]}"
        body = {
            "metadata": {"name": name},
            "spec": {
                "nodeName": node,
                "serviceAccountName": account,
                "containers": [{"name": "c", "image": "lmedge/test:0"}],
            },
        }
        made = self.admin.core.create_namespaced_pod(SYSTEM, body)
        self.pods.append(name)
        spec: dict[str, Any] = {
            "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": name,
                               "uid": made.metadata.uid},
            "expirationSeconds": 3600,
        }  # fmt: skip
        if audience:
            spec["audiences"] = [audience]
        return str(
            self.admin.core.create_namespaced_service_account_token(
                account, SYSTEM, {"spec": spec}
            ).status.token
        )

    def unbound(self, account: str) -> str:
        spec = {"audiences": [AUDIENCE], "expirationSeconds": 600}
        return str(
            self.admin.core.create_namespaced_service_account_token(
                account, SYSTEM, {"spec": spec}
            ).status.token
        )

    def close(self) -> None:
        for name in self.pods:
            self.admin.core.delete_namespaced_pod(name, SYSTEM, grace_period_seconds=0)


@pytest.fixture(scope="module")
def tokens(admin: KubeClient) -> Iterator[Tokens]:
    t = Tokens(admin)
    yield t
    t.close()


@pytest.fixture(scope="module")
def gateway_url(admin: KubeClient, tokens: Tokens) -> Iterator[str]:
    """worker-2's gateway, reviewing tokens with its own pod's (API-audience) token."""
    own = admin.with_token(tokens.bound(AGENT_SA, "worker-2", audience=None))
    auth = ServiceAccountAuth(
        node="worker-2",
        reviewer=kube_reviewer(own),
        audience=AUDIENCE,
        controller=f"system:serviceaccount:{SYSTEM}:{CONTROLLER_SA}",
        agent=f"system:serviceaccount:{SYSTEM}:{AGENT_SA}",
    )
    clients = HttpClients()
    core = Gateway(
        GatewaySettings(node="worker-2", services=SERVICES, tau_s=10.0),
        peers=clients,
        models=clients,
        sink=MemorySink(),
    )
    app = create_app(core, ApiSettings(token=USER_TOKEN, control_auth=auth))
    app.state.closers.append(clients.aclose)
    server = ServerThread(app).start()
    yield server.url
    server.stop()
    own.close()


def _put(url: str, header: str | None) -> httpx.Response:
    headers = {"Authorization": header} if header else {}
    return httpx.put(url + "/control/models", json=MODELS, headers=headers, timeout=30)


def test_the_controller_and_this_nodes_agent_control_the_gateway(
    gateway_url: str, tokens: Tokens
) -> None:
    for token in (tokens.bound(CONTROLLER_SA, "worker-1"), tokens.bound(AGENT_SA, "worker-2")):
        response = _put(gateway_url, f"Bearer {token}")
        assert response.status_code == 200, response.text
        assert response.json() == {"active": ["lm1"]}
        status = httpx.get(
            gateway_url + "/control/status", headers={"Authorization": f"Bearer {token}"}
        )
        assert status.status_code == 200, status.text


@pytest.mark.parametrize(
    ("who", "status", "message"),
    [
        ("agent-of-worker-3", 403, "the node agent of worker-3 may not control the gateway of "
         "worker-2"),
        ("unbound-agent", 403, "the node agent of no node (unbound token) may not control"),
        ("another-account", 403, f"system:serviceaccount:{SYSTEM}:default may not call the "
         "control API of worker-2"),
        ("api-audience", 401, "bearer token not accepted by the API server"),
        ("user-token", 401, "bearer token not accepted by the API server"),
        ("no-scheme", 401, "missing or wrong bearer token"),
        ("none", 401, "missing or wrong bearer token"),
    ],
)  # fmt: skip
def test_anyone_else_is_refused(
    gateway_url: str, tokens: Tokens, who: str, status: int, message: str
) -> None:
    header = {
        "agent-of-worker-3": lambda: f"Bearer {tokens.bound(AGENT_SA, 'worker-3')}",
        "unbound-agent": lambda: f"Bearer {tokens.unbound(AGENT_SA)}",
        "another-account": lambda: f"Bearer {tokens.bound('default', 'worker-2')}",
        "api-audience": lambda: f"Bearer {tokens.bound(CONTROLLER_SA, 'worker-1', None)}",
        "user-token": lambda: f"Bearer {USER_TOKEN}",
        "no-scheme": lambda: tokens.bound(CONTROLLER_SA, "worker-1"),
        "none": lambda: None,
    }[who]()

    response = _put(gateway_url, header)

    assert response.status_code == status, response.text
    assert message in response.json()["error"]["message"]
    if status == 401:
        assert response.headers["www-authenticate"] == "Bearer"


def test_the_scheme_is_case_insensitive(gateway_url: str, tokens: Tokens) -> None:
    token = tokens.bound(CONTROLLER_SA, "worker-1")
    assert _put(gateway_url, f"bearer {token}").status_code == 200
    assert _put(gateway_url, f"BEARER {token}").status_code == 200


def test_any_nodes_agent_may_forward_as_a_peer(gateway_url: str, tokens: Tokens) -> None:
    token = tokens.bound(AGENT_SA, "worker-3")
    # Past authorization the body is checked: an empty one is a client error,
    # not 401/403.
    response = httpx.post(
        gateway_url + "/internal/forward",
        json={},
        headers={"Authorization": f"Bearer {token}"},
        timeout=30,
    )
    assert response.status_code in (400, 422), response.text
    refused = httpx.post(
        gateway_url + "/internal/forward",
        json={},
        headers={"Authorization": f"Bearer {tokens.unbound(AGENT_SA)}"},
        timeout=30,
    )
    assert refused.status_code == 403


def test_node_agents_push_with_their_token_file(
    gateway_url: str, tokens: Tokens, tmp_path: Path
) -> None:
    # The node agent's client reads its projected token from a file, as in a pod.
    mine, theirs = tmp_path / "mine", tmp_path / "theirs"
    mine.write_text(tokens.bound(AGENT_SA, "worker-2") + "\n")
    theirs.write_text(tokens.bound(AGENT_SA, "worker-3"))
    own = GatewayClient({"worker-2": gateway_url}, mine)
    stolen = GatewayClient({"worker-2": gateway_url}, theirs)
    try:
        assert (
            own.push_models("worker-2", [ModelEndpoint(lm="lm2", url="http://10.0.0.8:8000")])
            is True
        )
        assert (
            stolen.push_models(
                "worker-2", [ModelEndpoint(lm="lm2", url="http://evil.example:8000")]
            )
            is False
        )
        # The kubelet rotates the file in place: the next call sends the new token.
        mine.write_text(tokens.bound(AGENT_SA, "worker-3"))
        assert (
            own.push_models("worker-2", [ModelEndpoint(lm="lm2", url="http://10.0.0.8:8000")])
            is False
        )
    finally:
        own.close()
        stolen.close()


def _lmedge(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(Path(sys.executable).parent / "lmedge"), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_gateway_with_only_a_user_token_refuses_to_start(tmp_path: Path) -> None:
    user = tmp_path / "user-token"
    user.write_text("secret-user-token\n")
    common = ["gateway", "--node", "worker-2", "--services", str(REPO / "examples/testbed"),
              "--store", str(tmp_path / "store"), "--port", "1"]  # fmt: skip

    done = _lmedge(*common, "--token-file", str(user))

    assert done.returncode != 0
    assert "a user API token is set but no control credential" in done.stderr
    assert "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
