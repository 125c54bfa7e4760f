"""The Helm chart (charts/lmedge) with the real Helm (built by `make tools`)
and the real test API server.

Without a cluster: `helm lint`, `helm template` with the default values and
with edge values (external MongoDB, no GPU exporters, existing Secrets), the
values schema and the chart's `fail` checks refusing bad values with their
message, and every command line the chart gives a container parsing with
the real `lmedge` CLI.

With the session cluster (kube-apiserver v1.36 + KWOK nodes): every rendered
manifest accepted by a server-side dry run, lmedge's own pods admitted under
the `restricted` Pod Security Standard, then `helm install` for real: the
chart's pods are scheduled onto the KWOK workers (KWOK runs no containers),
and the control plane (the controller and a node agent as local processes,
started with the arguments and service-account identities the chart gives
their pods) reaches a healthy state with decisions in the store.
"""

from __future__ import annotations

import base64
import importlib
import json
import os
import shlex
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import typer
import yaml
from kubernetes import client, dynamic
from kubernetes.client.rest import ApiException

from lmedge.errors import StoreError
from lmedge.operator.timeslicing import config_key, device_plugin_config
from lmedge.store import open_store
from tests.fixtures.cluster import KubeCluster, _tools_required, tools_dir, wait_until
from tests.fixtures.dataplane import free_port

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "lmedge"
SERVICES = REPO / "examples" / "testbed" / "services.yaml"
WORKERS = {f"worker-{i}" for i in range(1, 7)}
GPU_WORKERS = WORKERS - {"worker-1"}
# Values that turn the optional parts off or to their external forms.
EDGE_VALUES = [
    "--set", "mongodb.enabled=false",
    "--set", "mongodb.existingSecret=ext-mongo",
    "--set", "mongodb.existingSecretKey=mongodb-uri",
    "--set", "exporters.nodeExporter.enabled=false",
    "--set", "exporters.dcgmExporter.enabled=false",
    "--set", "llm.baseUrl=http://llm.example:8000/v1",
    "--set", "llm.model=gpt-4.1-mini",
    "--set", "llm.existingSecret=llm-key",
    "--set", "gateway.existingTokenSecret=gw-token",
    "--set", "networkPolicy.enabled=false",
]  # fmt: skip


#: Helm's cache, config and data homes: private to the session, set by `helm_bin`.
_HELM_ENV: dict[str, str] = {}


@pytest.fixture(scope="module")
def helm_bin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tools_dir() / "bin" / "helm"
    if not os.access(path, os.X_OK):
        reason = f"helm not built at {path} (run `make tools`)"
        if _tools_required():
            pytest.fail(reason)
        pytest.skip(reason)
    home = tmp_path_factory.mktemp("helm-home")
    for kind in ("CACHE", "CONFIG", "DATA"):
        _HELM_ENV[f"HELM_{kind}_HOME"] = str(home / kind.lower())
    return path


def helm(
    helm_bin: Path, *args: str, check: bool = True, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    # A private Helm home: nothing read from or written to the user's.
    env = {**os.environ, **_HELM_ENV}
    done = subprocess.run(
        [str(helm_bin), *args], capture_output=True, text=True, env=env, timeout=timeout
    )
    if check and done.returncode != 0:
        raise AssertionError(f"helm {shlex.join(args)} failed:\n{done.stderr}")
    return done


def template(
    helm_bin: Path, *values: str, namespace: str = "lmedge-system"
) -> list[dict[str, Any]]:
    out = helm(helm_bin, "template", "t", str(CHART), "-n", namespace, *values).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def by_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def pod_specs(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Pod spec of every workload (and the test Pod), by object name."""
    specs = {}
    for d in docs:
        if d["kind"] in ("Deployment", "DaemonSet", "StatefulSet"):
            specs[d["metadata"]["name"]] = d["spec"]["template"]["spec"]
        elif d["kind"] == "Pod":
            specs[d["metadata"]["name"]] = d["spec"]
    return specs


# -- no cluster -------------------------------------------------------------------


def test_lint_default_and_edge_values(helm_bin: Path) -> None:
    helm(helm_bin, "lint", "--strict", str(CHART))
    helm(helm_bin, "lint", "--strict", str(CHART), *EDGE_VALUES, "--set-file",
         f"lmServices={SERVICES}")  # fmt: skip


def test_default_render(helm_bin: Path) -> None:
    docs = template(helm_bin)
    kinds = sorted({d["kind"] for d in docs})
    assert kinds == sorted(
        ["ClusterRole", "ClusterRoleBinding", "ConfigMap", "DaemonSet", "Deployment", "Job",
         "NetworkPolicy", "Pod", "Role", "RoleBinding", "Secret", "Service", "ServiceAccount",
         "StatefulSet", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]
    )  # fmt: skip
    for d in docs:
        labels = d["metadata"]["labels"]
        for key in ("name", "instance", "component", "version", "managed-by", "part-of"):
            assert f"app.kubernetes.io/{key}" in labels, (d["kind"], d["metadata"]["name"])
    daemonsets = by_kind(docs, "DaemonSet")
    assert sorted(daemonsets) == ["t-lmedge-dcgm-exporter", "t-lmedge-node-agent",
                                  "t-lmedge-node-exporter"]  # fmt: skip
    # Without lmServices there is no gateway: the agent runs alone.
    agent = daemonsets["t-lmedge-node-agent"]["spec"]["template"]["spec"]
    assert [c["name"] for c in agent["containers"]] == ["node-agent"]
    assert agent["nodeSelector"] == {"lmedge.io/role": "worker"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in agent[
        "tolerations"
    ]
    # The agent scrapes its node's exporters, which listen on the node's address.
    env = {e["name"]: e for e in agent["containers"][0]["env"]}
    assert env["LMEDGE_EXPORTER_HOST"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.hostIP"}}
    dcgm = daemonsets["t-lmedge-dcgm-exporter"]["spec"]["template"]["spec"]["containers"][0]
    assert dcgm["ports"][0]["hostPort"] == 9400
    # MongoDB with authentication: a generated password, in its Secret and in
    # the URI every component reads from its own Secret file.
    secrets = by_kind(docs, "Secret")
    mongo = secrets["t-lmedge-mongodb"]["stringData"]
    assert mongo["username"] == "lmedge" and len(mongo["password"]) == 32
    store = secrets["t-lmedge-store"]["stringData"]["uri"]
    assert store == (
        f"mongodb://lmedge:{mongo['password']}@t-lmedge-mongodb.lmedge-system.svc:27017/lmedge"
        "?authSource=admin"
    )
    mongod = pod_specs(docs)["t-lmedge-mongodb"]["containers"][0]
    assert "--auth" in mongod["args"]
    assert {e["name"]: e["value"] for e in mongod["env"]} == {
        "MONGO_INITDB_ROOT_USERNAME_FILE": "/etc/mongodb-auth/username",
        "MONGO_INITDB_ROOT_PASSWORD_FILE": "/etc/mongodb-auth/password",
    }
    # Only lmedge's own pods reach it (model pods are app.kubernetes.io/name=lmedge-model).
    policy = by_kind(docs, "NetworkPolicy")["t-lmedge-mongodb"]["spec"]
    assert policy["ingress"] == [
        {"from": [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "lmedge",
                                                   "app.kubernetes.io/instance": "t"}}}],
         "ports": [{"port": "mongodb", "protocol": "TCP"}]}
    ]  # fmt: skip
    sts = by_kind(docs, "StatefulSet")["t-lmedge-mongodb"]
    assert sts["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"] == {
        "storage": "8Gi"
    }
    hooks = [d for d in docs if d["kind"] == "Pod"]
    assert [h["metadata"]["annotations"]["helm.sh/hook"] for h in hooks] == ["test"]
    # `helm uninstall` first releases the LMServices, while the operator runs
    # (the hook's account, Role and binding are pre-delete hooks too).
    uninstall = [d for d in docs if "uninstall" in d["metadata"]["name"]]
    assert sorted(d["kind"] for d in uninstall) == ["Job", "Role", "RoleBinding", "ServiceAccount"]
    assert {d["metadata"]["annotations"]["helm.sh/hook"] for d in uninstall} == {"pre-delete"}
    (job,) = by_kind(docs, "Job").values()
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["python", "-m", "lmedge.operator.uninstall"]
    assert "--namespace=default" in container["args"]  # the workloadNamespace value


def test_lmedge_pods_are_hardened(helm_bin: Path) -> None:
    docs = template(helm_bin, "--set-file", f"lmServices={SERVICES}")
    for name, spec in pod_specs(docs).items():
        if "exporter" in name:
            continue  # host access by design; checked below
        assert spec["securityContext"]["runAsNonRoot"] is True, name
        for c in spec["containers"]:
            sc = c["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True, (name, c["name"])
            assert sc["allowPrivilegeEscalation"] is False, (name, c["name"])
            assert sc["capabilities"]["drop"] == ["ALL"], (name, c["name"])
            assert c["resources"]["requests"] and c["resources"]["limits"], (name, c["name"])
    # The one root process: the node agent's init container, which hands the
    # progress hostPath to uid 10001 with CHOWN and FOWNER only.
    (init,) = pod_specs(docs)["t-lmedge-node-agent"]["initContainers"]
    assert init["securityContext"]["runAsUser"] == 0
    assert init["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN", "FOWNER"]}
    assert init["command"][-1] == (
        "chown 10001:10001 /var/lib/lmedge/progress && chmod 0750 /var/lib/lmedge/progress"
    )
    # Every lmedge container can spill: its own writable directory for the
    # default ./.lmedge/spill (the root filesystem is read-only).
    for name, spec in pod_specs(docs).items():
        if "exporter" in name or "mongodb" in name or "test" in name:
            continue
        for c in spec["containers"]:
            (mount,) = [m for m in c["volumeMounts"] if m["name"] == "spill"]
            assert mount == {"name": "spill", "mountPath": "/home/lmedge/.lmedge/spill",
                             "subPath": c["name"]}, (name, c["name"])  # fmt: skip
        assert {"name": "spill", "emptyDir": {"sizeLimit": "256Mi"}} in spec["volumes"], name
    ne = pod_specs(docs)["t-lmedge-node-exporter"]
    assert (
        ne["securityContext"]["runAsUser"] == 65534 and ne["automountServiceAccountToken"] is False
    )


def test_gateway_sits_beside_the_agent(helm_bin: Path) -> None:
    docs = template(helm_bin, "--set-file", f"lmServices={SERVICES}")
    agent = pod_specs(docs)["t-lmedge-node-agent"]
    agent_c, gateway_c = agent["containers"]
    assert "--gateway=http://127.0.0.1:8080" in agent_c["args"]
    assert gateway_c["ports"] == [
        {"name": "http", "containerPort": 8080, "hostPort": 8080, "protocol": "TCP"}
    ]
    services = by_kind(docs, "ConfigMap")["t-lmedge-services"]["data"]["services.yaml"]
    assert [d["metadata"]["name"] for d in yaml.safe_load_all(services) if d] == [
        "lm1", "lm2", "lm3", "lm4",
    ]  # fmt: skip
    svc = by_kind(docs, "Service")["t-lmedge-gateway"]["spec"]
    assert svc["internalTrafficPolicy"] == "Local"
    controller = pod_specs(docs)["t-lmedge-controller"]["containers"][0]
    assert "--gateway-url-template=http://{node}:8080" in controller["args"]


def test_edge_values_render(helm_bin: Path) -> None:
    docs = template(helm_bin, *EDGE_VALUES)
    assert "StatefulSet" not in {d["kind"] for d in docs}
    assert "NetworkPolicy" not in {d["kind"] for d in docs}
    assert sorted(by_kind(docs, "DaemonSet")) == ["t-lmedge-node-agent"]
    assert by_kind(docs, "Secret") == {}  # every secret is the user's own
    controller = pod_specs(docs)["t-lmedge-controller"]
    env = {e["name"]: e for e in controller["containers"][0]["env"]}
    assert env["LMEDGE_STORE_FILE"]["value"] == "/var/run/secrets/lmedge/store/uri"
    assert {"name": "store", "secret": {"secretName": "ext-mongo",
            "items": [{"key": "mongodb-uri", "path": "uri"}]}} in controller["volumes"]  # fmt: skip
    assert env["LMEDGE_LLM_API_KEY_FILE"]["value"] == "/var/run/secrets/lmedge/llm/api-key"
    assert env["LMEDGE_LLM_MODEL"]["value"] == "gpt-4.1-mini"
    assert "LMEDGE_LLM_API_KEY" not in env  # the key is a file, never an env var
    agent_env = {e["name"] for e in pod_specs(docs)["t-lmedge-node-agent"]["containers"][0]["env"]}
    assert "LMEDGE_EXPORTER_HOST" not in agent_env  # no exporters, no scraping
    assert {"name": "llm-key", "secret": {"secretName": "llm-key",
            "items": [{"key": "api-key", "path": "api-key"}]}} in controller["volumes"]  # fmt: skip

    agent = pod_specs(template(helm_bin, *EDGE_VALUES, "--set-file", f"lmServices={SERVICES}"))[
        "t-lmedge-node-agent"
    ]
    assert {"name": "user-token", "secret": {"secretName": "gw-token",
            "items": [{"key": "token", "path": "token"}]}} in agent["volumes"]  # fmt: skip

    external = template(helm_bin, "--set", "mongodb.enabled=false",
                        "--set", "mongodb.uri=mongodb://db.example:27017/edge")  # fmt: skip
    assert by_kind(external, "Secret")["t-lmedge-store"]["stringData"]["uri"] == (
        "mongodb://db.example:27017/edge"
    )


def _containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [*spec.get("initContainers", []), *spec["containers"]]


def test_no_secret_is_an_environment_variable_or_an_argument(helm_bin: Path) -> None:
    # The store URI (with MongoDB's password), the users' API token and the
    # LLM key are mounted files; the control API takes no shared secret.
    docs = template(helm_bin, "--set-file", f"lmServices={SERVICES}",
                    "--set", "llm.apiKey=sk-test-key", "--set", "llm.model=m")  # fmt: skip
    secrets = by_kind(docs, "Secret")
    assert sorted(secrets) == ["t-lmedge-gateway-token", "t-lmedge-llm", "t-lmedge-mongodb",
                               "t-lmedge-store"]  # fmt: skip
    values = [v for d in secrets.values() for v in d["stringData"].values() if len(v) >= 8]
    values.append(secrets["t-lmedge-mongodb"]["stringData"]["password"])
    for name, spec in pod_specs(docs).items():
        for c in _containers(spec):
            for e in c.get("env", []):
                assert "secretKeyRef" not in e.get("valueFrom", {}), (name, c["name"], e)
                assert not any(v in str(e.get("value", "")) for v in values), (name, e)
            for a in [*c.get("args", []), *c.get("command", [])]:
                assert not any(v in a for v in values), (name, c["name"], a)
            assert not c.get("envFrom"), (name, c["name"])


def test_gateways_verify_the_callers_service_account_token(helm_bin: Path) -> None:
    docs = template(helm_bin, "--set-file", f"lmServices={SERVICES}")
    specs = pod_specs(docs)
    projected = {"name": "gateway-token", "projected": {"sources": [{"serviceAccountToken": {
        "audience": "lmedge-gateway", "expirationSeconds": 3600, "path": "token"}}]}}  # fmt: skip
    agent_c, gateway_c = specs["t-lmedge-node-agent"]["containers"]
    controller_c = specs["t-lmedge-controller"]["containers"][0]
    for spec in (specs["t-lmedge-node-agent"], specs["t-lmedge-controller"]):
        assert projected in spec["volumes"]
    for c in (agent_c, controller_c):
        assert "--control-token-file=/var/run/secrets/lmedge/gateway/token" in c["args"]
    assert {
        "--control-audience=lmedge-gateway",
        "--controller-account=lmedge-system/t-lmedge-controller",
        "--agent-account=lmedge-system/t-lmedge-node-agent",
        "--peer-token-file=/var/run/secrets/lmedge/gateway/token",
        "--token-file=/var/run/secrets/lmedge/user-token/token",
    } <= set(gateway_c["args"])
    assert "--model-service-account=t-lmedge-model" in agent_c["args"]
    model_sa = by_kind(docs, "ServiceAccount")["t-lmedge-model"]
    assert model_sa["automountServiceAccountToken"] is False
    assert model_sa["metadata"]["namespace"] == "default"
    # The model pods' account has no role: no binding names it.
    bindings = [d for d in docs if d["kind"] in ("RoleBinding", "ClusterRoleBinding")]
    assert not [b for b in bindings if any(s["name"] == "t-lmedge-model" for s in b["subjects"])]


def test_model_pods_take_traffic_only_from_the_gateways_and_the_controller(helm_bin: Path) -> None:
    # A model pod's /infer takes no credential: only this release's node-agent
    # pods (the gateways) and its controller (the engines' /metrics) may reach it.
    docs = template(helm_bin, "--set", "workloadNamespace=lm-serving")
    policy = by_kind(docs, "NetworkPolicy")["t-lmedge-model-servers"]
    assert policy["metadata"]["namespace"] == "lm-serving"
    assert policy["spec"]["podSelector"] == {"matchLabels": {
        "app.kubernetes.io/name": "lmedge-model",
        "app.kubernetes.io/managed-by": "lmedge-node-agent"}}  # fmt: skip
    assert policy["spec"]["ingress"] == [{
        "from": [{"namespaceSelector": {"matchLabels": {
                      "kubernetes.io/metadata.name": "lmedge-system"}},
                  "podSelector": {"matchLabels": {
                      "app.kubernetes.io/name": "lmedge", "app.kubernetes.io/instance": "t",
                      "app.kubernetes.io/component": "node-agent"}}},
                 {"namespaceSelector": {"matchLabels": {
                      "kubernetes.io/metadata.name": "lmedge-system"}},
                  "podSelector": {"matchLabels": {
                      "app.kubernetes.io/name": "lmedge", "app.kubernetes.io/instance": "t",
                      "app.kubernetes.io/component": "controller"}}}],
        "ports": [{"port": 8000, "protocol": "TCP"}]}]  # fmt: skip


def test_deploy_rbac_is_the_charts(helm_bin: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "tools" / "render-rbac.py"), "--helm", str(helm_bin),
         "--check"],
        capture_output=True, text=True, env={**os.environ, **_HELM_ENV},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr


def test_time_slicing_configmap_is_what_the_operator_writes(helm_bin: Path) -> None:
    # Identical text: the operator's later patch changes nothing it did not add.
    docs = template(helm_bin, "--set", "timeSlicing.replicas={1,2,4}")
    data = by_kind(docs, "ConfigMap")["t-lmedge-time-slicing"]["data"]
    assert data == {
        config_key(n): yaml.safe_dump(device_plugin_config(n), sort_keys=False) for n in (1, 2, 4)
    }
    moved = template(helm_bin, "--set", "timeSlicing.namespace=gpu-operator")
    assert by_kind(moved, "ConfigMap")["t-lmedge-time-slicing"]["metadata"]["namespace"] == (
        "gpu-operator"
    )
    role = by_kind(moved, "Role")["t-lmedge-controller-time-slicing"]
    assert role["metadata"]["namespace"] == "gpu-operator"
    controller = pod_specs(moved)["t-lmedge-controller"]["containers"][0]
    env = {e["name"]: e.get("value") for e in controller["env"]}
    assert env["LMEDGE_TIMESLICING_NAMESPACE"] == "gpu-operator"
    assert env["LMEDGE_TIMESLICING_CONFIGMAP"] == "t-lmedge-time-slicing"


def test_service_monitors_need_the_prometheus_operator(helm_bin: Path) -> None:
    values = ["--set", "exporters.serviceMonitor.enabled=true", "--set-file",
              f"lmServices={SERVICES}"]  # fmt: skip
    refused = helm(helm_bin, "template", "t", str(CHART), *values, check=False)
    assert refused.returncode != 0
    assert "needs the Prometheus Operator CRDs" in refused.stderr
    docs = template(helm_bin, *values, "--api-versions", "monitoring.coreos.com/v1/ServiceMonitor")
    assert sorted(by_kind(docs, "ServiceMonitor")) == [
        "t-lmedge-dcgm-exporter", "t-lmedge-gateway", "t-lmedge-node-exporter",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (["--set", "loop.lambda=2"], "at '/loop/lambda': maximum"),
        (["--set", "policy.profile=Not A Profile"], "at '/policy/profile'"),
        (["--set", "mongodb.image=mongo:latest"], "at '/mongodb/image'"),
        (["--set", "gatway.port=1"], "additional properties 'gatway' not allowed"),
        (["--set", "mongodb.enabled=false"],
         "mongodb.enabled=false needs mongodb.uri (e.g. mongodb://mongo.db:27017/lmedge) "
         "or mongodb.existingSecret"),
        (["--set", "mongodb.uri=mongodb://x/db"],
         "mongodb.uri and mongodb.existingSecret are for an external MongoDB"),
        (["--set", "mongodb.enabled=false", "--set", "mongodb.uri=postgres://x"],
         "mongodb.uri must start with mongodb:// or mongodb+srv://"),
        (["--set", "llm.baseUrl=http://llm:8000/v1", "--set", "llm.model=m"],
         "llm.baseUrl is set: give its key with llm.apiKey or llm.existingSecret"),
        (["--set", "llm.apiKey=k", "--set", "llm.existingSecret=s", "--set", "llm.model=m"],
         "set llm.apiKey or llm.existingSecret, not both"),
        (["--set", "llm.apiKey=k"], "an LLM is configured: set llm.model"),
        (["--set", "exporters.dcgmExporter.port=9401"],
         "the node agents scrape dcgm-exporter on 9400"),
        (["--set", "gateway.urlTemplate=http://gw:8080"],
         "gateway.urlTemplate must contain {node}"),
        (["--set", "controlToken.existingSecret=ctl"],
         "additional properties 'controlToken' not allowed"),
        (["--set", "mongodb.auth.username=a b"], "at '/mongodb/auth/username'"),
        (["--set", "spill.sizeLimit=lots"], "at '/spill/sizeLimit'"),
    ],
)  # fmt: skip
def test_bad_values_are_refused_with_a_message(
    helm_bin: Path, values: list[str], message: str
) -> None:
    done = helm(helm_bin, "template", "t", str(CHART), *values, check=False)
    assert done.returncode != 0
    assert message in done.stderr, done.stderr


def _click_command(name: str) -> Any:
    from lmedge.cli import COMMAND_MODULES

    # A fresh app with every command module, as `lmedge` builds its own.
    app = typer.Typer()
    app.callback()(lambda: None)
    for module in COMMAND_MODULES:
        importlib.import_module(module).register(app)
    # Typer's command tree (a click Group, or Typer's vendored copy of click's).
    return typer.main.get_command(app).commands[name]  # type: ignore[attr-defined]


def test_every_container_command_parses_with_the_lmedge_cli(
    helm_bin: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The chart's args against the real CLI's options (parse only, nothing runs);
    # $(VAR) references are expanded by the kubelet and stay opaque here, and
    # NODE_NAME is what the pod's downward API sets.
    monkeypatch.setenv("NODE_NAME", "worker-2")
    values = ["--set-file", f"lmServices={SERVICES}", "--set", "policy.planner=static",
              "--set", "policy.deployer=lyapunov",
              "--set", "controller.operator=false"]  # fmt: skip
    checked = []
    for spec in pod_specs(template(helm_bin, *values)).values():
        for c in spec["containers"]:
            if not c.get("image", "").startswith("ghcr.io/lmedge/lmedge"):
                continue
            command, *args = c["args"]
            _click_command(command).make_context(command, list(args))
            checked.append(command)
    assert sorted(checked) == ["controller", "dashboard", "gateway", "node-agent", "status"]


# -- the test API server ------------------------------------------------------------


def _dry_run(cluster: KubeCluster, docs: list[dict[str, Any]], namespace: str) -> list[str]:
    """Create every object with dryRun=All; the refusals, one line each."""
    refused = []
    with cluster.api_client() as api:
        dyn = dynamic.DynamicClient(api)
        for doc in docs:
            res = dyn.resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
            where = namespace if res.namespaced else None
            try:
                try:
                    res.create(body=doc, namespace=where, dry_run="All")
                except ApiException as exc:
                    if exc.status != 409:
                        raise
                    # Already there (the session's CRDs): a dry-run update instead.
                    live = res.get(name=doc["metadata"]["name"], namespace=where)
                    body = {**doc, "metadata": {**doc["metadata"],
                            "resourceVersion": live.metadata.resourceVersion}}  # fmt: skip
                    res.replace(body=body, namespace=where, dry_run="All")
            except ApiException as exc:
                try:
                    why = json.loads(exc.body or "{}").get("message", exc.body)
                except ValueError:
                    why = exc.body
                refused.append(f"{doc['kind']}/{doc['metadata']['name']}: {exc.status} {why}")
    return refused


@pytest.mark.parametrize("variant", ["default", "gateway", "edge"])
def test_rendered_manifests_pass_a_server_side_dry_run(
    helm_bin: Path, lmedge_cluster: KubeCluster, variant: str
) -> None:
    ns = lmedge_cluster.create_namespace(f"helm-dry-{uuid.uuid4().hex[:6]}")
    values = {
        "default": [],
        "gateway": ["--set-file", f"lmServices={SERVICES}"],
        "edge": [*EDGE_VALUES, "--set-file", f"lmServices={SERVICES}"],
    }[variant]
    # The workload namespace's objects (model account, roles, model-images
    # ConfigMap) go to the same test namespace.
    docs = template(helm_bin, "--include-crds", *values, "--set", f"workloadNamespace={ns}",
                    namespace=ns)  # fmt: skip
    assert {d["kind"] for d in docs} >= {"CustomResourceDefinition", "DaemonSet", "Deployment"}
    try:
        assert _dry_run(lmedge_cluster, docs, ns) == []
    finally:
        _delete_namespace(lmedge_cluster, ns)


@pytest.mark.parametrize("host_port", [8080, 0])
def test_lmedge_pods_meet_the_restricted_pod_security_standard(
    helm_bin: Path, lmedge_cluster: KubeCluster, host_port: int
) -> None:
    # The API server's PodSecurity admission enforces on Pods; each workload's
    # pod template is created (dry run) as a Pod in a `restricted` namespace.
    ns = lmedge_cluster.create_namespace(f"helm-pss-{uuid.uuid4().hex[:6]}")
    docs = template(helm_bin, "--set-file", f"lmServices={SERVICES}",
                    "--set", f"gateway.hostPort={host_port}", "--set", f"workloadNamespace={ns}",
                    namespace=ns)  # fmt: skip
    pods = []
    for name, spec in pod_specs(docs).items():
        if name.endswith("mongodb"):  # its claim template stands in for a volume
            spec["volumes"].append({"name": "data", "emptyDir": {}})
        pods.append({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec})
    try:
        with lmedge_cluster.api_client() as api:
            core = client.CoreV1Api(api)
            core.patch_namespace(
                ns, {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "restricted"}}}
            )
            for account in by_kind(docs, "ServiceAccount").values():
                core.create_namespaced_service_account(ns, account)
        refused = dict(r.split(": ", 1) for r in _dry_run(lmedge_cluster, pods, ns))
    finally:
        _delete_namespace(lmedge_cluster, ns)
    # The exporters need host access (node-exporter: host network, PID and
    # paths; dcgm-exporter: root and SYS_ADMIN for DCGM); the node agent the
    # gateway's hostPort, which peers and the controller reach it by, and the
    # progress hostPath its init container hands to uid 10001 as root with
    # CHOWN and FOWNER. Nothing else in it breaks the standard.
    expected = {"Pod/t-lmedge-dcgm-exporter", "Pod/t-lmedge-node-exporter",
                "Pod/t-lmedge-node-agent"}  # fmt: skip
    assert set(refused) == expected, refused
    agent = refused["Pod/t-lmedge-node-agent"]
    reasons = agent.split('violates PodSecurity "restricted:latest": ')[1]
    assert reasons == ", ".join(
        ([f'hostPort (container "gateway" uses hostPort {host_port})'] if host_port else [])
        + [
            'unrestricted capabilities (container "progress-dir" must not include "CHOWN", '
            '"FOWNER" in securityContext.capabilities.add)',
            'restricted volume types (volume "progress" uses restricted volume type "hostPath")',
            'runAsNonRoot != true (container "progress-dir" must not set '
            "securityContext.runAsNonRoot=false)",
            'runAsUser=0 (container "progress-dir" must not set runAsUser=0)',
        ]
    ), reasons


def _delete_namespace(cluster: KubeCluster, name: str) -> None:
    with cluster.api_client() as api:
        try:
            client.CoreV1Api(api).delete_namespace(name)
        except ApiException as exc:
            if exc.status != 404:
                raise


def _kubeconfig_with_token(cluster: KubeCluster, token: str, path: Path) -> Path:
    """A kubeconfig for `cluster` authenticating with a service-account token."""
    config = json.loads(cluster.kubeconfig.read_text())
    config["users"] = [{"name": "lmedge-admin", "user": {"token": token}}]
    path.write_text(json.dumps(config))
    path.chmod(0o600)
    return path


def _pod_token(core: client.CoreV1Api, namespace: str, pod: Any) -> str:
    """The token the kubelet would project into `pod`: its service account, bound to it."""
    request = {
        "spec": {
            "boundObjectRef": {
                "apiVersion": "v1", "kind": "Pod",
                "name": pod.metadata.name, "uid": pod.metadata.uid,
            },
            "expirationSeconds": 3600,
        }
    }  # fmt: skip
    made = core.create_namespaced_service_account_token(
        pod.spec.service_account_name, namespace, request
    )
    return str(made.status.token)


def _local_args(container: Any, drop: tuple[str, ...]) -> list[str]:
    """The container's args, less those naming things only a real pod has."""
    return [a for a in container.args[1:] if not a.startswith(drop)]


@pytest.fixture
def release(
    helm_bin: Path, lmedge_cluster: KubeCluster, tmp_path: Path
) -> Iterator[dict[str, str]]:
    """`helm install` of the chart; uninstalled and cleaned up afterwards."""
    suffix = uuid.uuid4().hex[:6]
    ns, wns, storage_class = f"lmh-{suffix}", f"lmw-{suffix}", f"lmedge-test-{suffix}"
    lmedge_cluster.create_namespace(wns)
    with lmedge_cluster.api_client() as api:
        core = client.CoreV1Api(api)
        custom = client.CustomObjectsApi(api)
        for doc in yaml.safe_load_all(SERVICES.read_text()):
            if doc:
                custom.create_namespaced_custom_object(
                    "lmedge.io", "v1alpha1", wns, "lmservices", doc
                )
        # No provisioner in the test cluster: a static volume of the class the
        # release asks for, which the PV controller binds to MongoDB's claim.
        core.create_persistent_volume(
            {
                "metadata": {"name": storage_class},
                "spec": {
                    "capacity": {"storage": "8Gi"},
                    "accessModes": ["ReadWriteOnce"],
                    "storageClassName": storage_class,
                    "hostPath": {"path": str(tmp_path / "mongo")},
                },
            }
        )
    kubeconfig = str(lmedge_cluster.kubeconfig)
    installed = helm(
        helm_bin, "install", "lmh", str(CHART), "-n", ns, "--create-namespace",
        "--kubeconfig", kubeconfig, "--wait", "--timeout", "180s",
        "--set", f"workloadNamespace={wns}",
        "--set-file", f"lmServices={SERVICES}",
        "--set", f"mongodb.persistence.storageClass={storage_class}",
        "--set", "policy.profile=rf",
        "--set", "loop.slotSeconds=1",
        "--set", "loop.epochSlots=5",
        check=False,
    )  # fmt: skip
    try:
        assert installed.returncode == 0, installed.stderr
        yield {"namespace": ns, "workloads": wns, "output": installed.stdout}
    finally:
        # KWOK runs no containers, so the pre-delete hook's Job would never
        # finish here (the real-node tier runs it). A failed uninstall would
        # leave the chart's cluster-wide policies behind for later tests.
        helm(helm_bin, "uninstall", "lmh", "-n", ns, "--kubeconfig", kubeconfig,
             "--no-hooks", "--wait", "--timeout", "120s")  # fmt: skip
        with lmedge_cluster.api_client() as api:
            core = client.CoreV1Api(api)
            for name in (ns, wns):
                _delete_namespace(lmedge_cluster, name)
            try:
                core.delete_persistent_volume(storage_class)
            except ApiException as exc:
                if exc.status != 404:
                    raise


def _lmedge(args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [str(Path(sys.executable).parent / "lmedge"), *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )


@pytest.mark.slow
def test_helm_install_and_the_control_plane_runs_on_it(
    helm_bin: Path,
    release: dict[str, str],
    lmedge_cluster: KubeCluster,
    ferretdb_uri: str,
    tmp_path: Path,
) -> None:
    ns, wns = release["namespace"], release["workloads"]
    assert "Next steps" in release["output"]  # NOTES.txt
    api = lmedge_cluster.api_client()
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)

    def pods(component: str) -> list[Any]:
        selector = f"app.kubernetes.io/instance=lmh,app.kubernetes.io/component={component}"
        return list(core.list_namespaced_pod(ns, label_selector=selector).items)

    def running_on(component: str) -> set[str]:
        return {p.spec.node_name for p in pods(component) if p.status.phase == "Running"}

    # Scheduled onto the KWOK workers; KWOK reports them Running. The
    # DaemonSets wait for the operator's Node labels (below).
    assert len(running_on("controller")) == 1 and running_on("controller") <= WORKERS
    assert len(running_on("mongodb")) == 1
    claim = core.read_namespaced_persistent_volume_claim("data-lmh-lmedge-mongodb-0", ns)
    assert claim.status.phase == "Bound"

    # The control plane, as the chart runs it: the Deployment's and the
    # DaemonSet's own args and environment, each process with the token of
    # the chart's service account bound to the pod it stands in for.
    deployment = apps.read_namespaced_deployment("lmh-lmedge-controller", ns)
    container = deployment.spec.template.spec.containers[0]
    controller_pod = pods("controller")[0]
    controller_kc = _kubeconfig_with_token(
        lmedge_cluster, _pod_token(core, ns, controller_pod), tmp_path / "controller.kubeconfig"
    )
    env = {**os.environ, "LMEDGE_STORE": ferretdb_uri, "POD_NAME": controller_pod.metadata.name,
           "KUBECONFIG": str(controller_kc)}  # fmt: skip
    env.update({e.name: e.value for e in container.env if e.value is not None})
    run = f"helm-{uuid.uuid4().hex[:6]}"
    # Gateways are pods KWOK does not run: no gateway URLs for the local controller.
    args = _local_args(container, drop=("--gateway-url-template", "--control-token-file"))
    # Both processes run on this host: each serves its metrics on a port of its own.
    controller_metrics, agent_metrics = free_port(), free_port()
    assert "--metrics-port=9464" in args
    args = [f"--metrics-port={controller_metrics}" if a.startswith("--metrics-port") else a
            for a in args]  # fmt: skip
    log = tmp_path / "control-plane.log"
    procs = [_lmedge(["controller", *args, "--run", run, "--kubeconfig", str(controller_kc)],
                     log, env)]  # fmt: skip
    store = open_store(ferretdb_uri)

    def started() -> bool:
        try:
            return any(r.id == run for r in store.runs(limit=5))
        except StoreError:
            return False

    try:
        wait_until(started, 90, f"the controller to register run {run}\n{log.read_text()}")
        # The operator labels the EdgeNodes' Nodes; the agents follow.
        wait_until(lambda: running_on("node-agent") == WORKERS, 60, "a node agent on every worker")
        wait_until(lambda: running_on("node-exporter") == WORKERS, 60, "node-exporters")
        wait_until(lambda: running_on("dcgm-exporter") == GPU_WORKERS, 60, "dcgm-exporters")
        agent_pod = next(p for p in pods("node-agent") if p.spec.node_name == "worker-2")
        token_file = tmp_path / "agent.token"
        token_file.write_text(_pod_token(core, ns, agent_pod))
        daemonset = apps.read_namespaced_daemon_set("lmh-lmedge-node-agent", ns)
        agent_c = daemonset.spec.template.spec.containers[0]
        # The chart's agent args, less the gateway and the host's progress directory
        # (no pod here); its model pods still run as the chart's model account.
        agent_args = _local_args(
            agent_c, drop=("--gateway=", "--control-token-file", "--progress-root")
        )
        assert "--model-service-account=lmh-lmedge-model" in agent_args
        agent_args = [f"--metrics-port={agent_metrics}" if a.startswith("--metrics-port") else a
                      for a in agent_args]  # fmt: skip
        agent_env = {**os.environ, "LMEDGE_STORE": ferretdb_uri, "NODE_NAME": "worker-2"}
        procs.append(_lmedge(["node-agent", *agent_args, "--kubeconfig",
                              str(lmedge_cluster.kubeconfig), "--token-file", str(token_file)],
                             log, agent_env))  # fmt: skip

        def deployed() -> list[Any]:
            return store.decisions(agent="deployer", run=run, node="worker-2", limit=50)

        wait_until(lambda: len(deployed()) >= 3, 90, f"three slots of the agent\n{log.read_text()}")
        # The chart's metrics ports serve the control plane's series.
        agent_text = httpx.get(f"http://127.0.0.1:{agent_metrics}/metrics", timeout=10).text
        assert 'lmedge_node_agent_last_slot{node="worker-2"}' in agent_text
        assert 'lmedge_agent_decisions_total{agent="deployer"' in agent_text
        ctl_text = httpx.get(f"http://127.0.0.1:{controller_metrics}/metrics", timeout=10).text
        assert 'lmedge_agent_decisions_total{agent="scheduler"' in ctl_text
        assert "lmedge_controller_slot " in ctl_text

        def model_pods() -> list[Any]:
            return list(core.list_namespaced_pod(wns, label_selector="lmedge.io/lm").items)

        wait_until(lambda: bool(model_pods()), 60, "the agent's model pods")
        wait_until(lambda: all(p.status.phase == "Running" for p in model_pods()), 60, "Running")

        assert {p.spec.node_name for p in model_pods()} == {"worker-2"}
        assert store.decisions(agent="planner", run=run, limit=1)
        routed = store.decisions(agent="scheduler", run=run, limit=1)
        assert routed and routed[0].value.routes
        assert all(d.outcome == "accepted" for d in deployed()), log.read_text()[-3000:]
        lease = client.CoordinationV1Api(api).read_namespaced_lease("lmh-lmedge-controller", ns)
        assert lease.spec.holder_identity == controller_pod.metadata.name
        slicing = core.read_namespaced_config_map("lmh-lmedge-time-slicing", ns)
        assert set(slicing.data) == {config_key(2)}

        # The chart's admission policy confines the agent's identity to worker-2:
        # a copy of one of its own model pods, moved to worker-3, is refused for
        # the node alone (every other rule the copy satisfies, so no other
        # policy's message can come first).
        agent_api = _client_with_token(lmedge_cluster, token_file.read_text())
        agent_client = client.CoreV1Api(agent_api)
        own = agent_api.sanitize_for_serialization(model_pods()[0])
        meta = own["metadata"]
        probe = {
            "metadata": {
                "name": "probe",
                "labels": meta.get("labels", {}),
                "ownerReferences": meta.get("ownerReferences", []),
            },
            "spec": {**own["spec"], "nodeName": "worker-3"},
        }

        def refused() -> bool:
            try:
                agent_client.create_namespaced_pod(wns, probe, dry_run="All")
            except ApiException as exc:
                return exc.status == 403 and "only on its own node" in (exc.body or "")
            return False

        wait_until(refused, 30, "the chart's admission policy to refuse worker-3")
        # `helm test`'s pod: KWOK runs no container, so its command runs here
        # against the store its environment names.
        hooks = helm(helm_bin, "get", "hooks", "lmh", "-n", ns,
                     "--kubeconfig", str(lmedge_cluster.kubeconfig)).stdout  # fmt: skip
        # (The others are the uninstall hook's, pre-delete.)
        (hook,) = [h for h in yaml.safe_load_all(hooks)
                   if h and h["metadata"]["annotations"]["helm.sh/hook"] == "test"]  # fmt: skip
        status = subprocess.run(
            [str(Path(sys.executable).parent / "lmedge"), *hook["spec"]["containers"][0]["args"],
             "--json"],
            env={**os.environ, "LMEDGE_STORE": ferretdb_uri},
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert status.returncode == 0, status.stderr
        report = json.loads(status.stdout)
        assert report["run"] == run and report["counts"]["deployments"] >= 3

        # Nothing the processes did was refused: the chart's RBAC is enough.
        assert "orbidden" not in log.read_text(), log.read_text()[-3000:]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        codes = [proc.wait(timeout=60) for proc in procs]
        store.close()
        api.close()
    assert codes == [0, 0], log.read_text()[-3000:]


def _client_with_token(cluster: KubeCluster, token: str) -> client.ApiClient:
    cfg = client.Configuration()
    cfg.host = cluster.server
    cfg.ssl_ca_cert = str(cluster.ca_file)
    cfg.api_key = {"authorization": "Bearer " + token.strip()}
    return client.ApiClient(cfg)


def test_generated_secrets_survive_an_upgrade(helm_bin: Path, lmedge_cluster: KubeCluster) -> None:
    # MongoDB keeps its first password and gateways and users hold the API
    # token: `helm upgrade` must not roll either.
    ns = f"lmh-up-{uuid.uuid4().hex[:6]}"
    kc = str(lmedge_cluster.kubeconfig)
    # No uninstall hook here (it runs in tests/realnode): after the previous
    # test's namespaces went, this cluster's API server answered the image
    # policy's binding with "no params found" although its ConfigMap existed,
    # refusing every pod create, the hook Job's too (uninstall hung 300 s).
    common = ["-n", ns, "--kubeconfig", kc, "--set-file", f"lmServices={SERVICES}",
              "--set", "exporters.nodeExporter.enabled=false",
              "--set", "exporters.dcgmExporter.enabled=false",
              "--set", "uninstallHook.enabled=false",
              "--set", "fullnameOverride=up"]  # fmt: skip
    helm(helm_bin, "install", "up", str(CHART), "--create-namespace", *common)
    try:
        with lmedge_cluster.api_client() as api:
            core = client.CoreV1Api(api)

            def secrets() -> dict[str, str]:
                out = {}
                for name, key in (("up-mongodb", "password"), ("up-store", "uri"),
                                  ("up-gateway-token", "token")):  # fmt: skip
                    data = core.read_namespaced_secret(name, ns).data
                    out[name] = base64.b64decode(data[key]).decode()
                return out

            first = secrets()
            assert len(first["up-gateway-token"]) == 40
            assert f":{first['up-mongodb']}@" in first["up-store"]
            helm(helm_bin, "upgrade", "up", str(CHART), *common, "--set", "policy.profile=rf")
            assert secrets() == first
    finally:
        helm(helm_bin, "uninstall", "up", "-n", ns, "--kubeconfig", kc, check=False)
        _delete_namespace(lmedge_cluster, ns)
