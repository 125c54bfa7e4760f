"""RBAC and the node-agent admission policy of `deploy/rbac/`, as shipped, on a
real API server.

The node agent authenticates the way it does in a cluster: with a service
account token bound (TokenRequest API) to its own Pod, here a KWOK pod on
worker-2, so the API server puts `authentication.kubernetes.io/node-name:
worker-2` into the request's user info and the ValidatingAdmissionPolicy can
compare it with each pod's `spec.nodeName`.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubernetes import client, dynamic
from kubernetes.client.rest import ApiException

from lmedge.api import Decision, LMPlacement, NodeObservation, Placement
from lmedge.backends.kubernetes.backend import KubernetesBackend, KubernetesSettings
from lmedge.backends.kubernetes.client import ClusterRefused, KubeClient
from lmedge.nodeagent.agent import NodeAgent
from tests.fixtures.cluster import REPO, KubeCluster, wait_until

SYSTEM = "lmedge-system"
AGENT_SA = "lmedge-node-agent"
AGENT_NODE = "worker-2"
POLICY_MESSAGE = (
    f"lmedge node agent on {AGENT_NODE} may create and delete pods only on its own node"
)


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


@pytest.fixture(scope="module")
def installed(lmedge_cluster: KubeCluster) -> Iterator[KubeCluster]:
    """deploy/rbac/*.yaml applied, as a Helm install would."""
    with lmedge_cluster.api_client() as api:
        try:
            lmedge_cluster.create_namespace(SYSTEM)
        except ApiException as exc:
            if exc.status != 409:
                raise
        for name in sorted((REPO / "deploy/rbac").glob("*.yaml")):
            apply_file(api, str(name.relative_to(REPO)))
    yield lmedge_cluster


@pytest.fixture(scope="module")
def namespace(installed: KubeCluster) -> str:
    return installed.create_namespace(f"adm-{uuid.uuid4().hex[:6]}")


@pytest.fixture(scope="module")
def admin(installed: KubeCluster) -> Iterator[KubeClient]:
    k = KubeClient.connect(installed.kubeconfig)
    yield k
    k.close()


@pytest.fixture(scope="module")
def agent(admin: KubeClient, namespace: str) -> Iterator[KubeClient]:
    """The node agent's client: a token bound to its pod on worker-2."""
    name = f"agent-{uuid.uuid4().hex[:6]}"
    body = pod(name, AGENT_NODE)
    body["spec"]["serviceAccountName"] = AGENT_SA
    made = admin.core.create_namespaced_pod(SYSTEM, body)
    token = admin.core.create_namespaced_service_account_token(
        AGENT_SA,
        SYSTEM,
        {
            "spec": {
                "boundObjectRef": {
                    "apiVersion": "v1", "kind": "Pod", "name": name, "uid": made.metadata.uid,
                },
                "expirationSeconds": 3600,
            }
        },
    ).status.token  # fmt: skip
    k = admin.with_token(token)

    # A policy takes effect once the API server has compiled it: wait for the
    # first refusal of a dry-run create on another node.
    def enforced() -> bool:
        try:
            k.core.create_namespaced_pod(namespace, pod("probe", "worker-3"), dry_run="All")
        except ApiException as exc:
            return exc.status == 403 and POLICY_MESSAGE in (exc.body or "")
        return False

    wait_until(enforced, 30, "the admission policy to be enforced")
    yield k
    k.close()
    admin.core.delete_namespaced_pod(name, SYSTEM)


def test_agent_token_carries_its_node(agent: KubeClient) -> None:
    review = client.AuthenticationV1Api(agent.api).create_self_subject_review(
        {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
    )
    info = review.status.user_info
    assert info.username == f"system:serviceaccount:{SYSTEM}:{AGENT_SA}"
    assert info.extra["authentication.kubernetes.io/node-name"] == [AGENT_NODE]


def test_agent_creates_and_deletes_pods_on_its_own_node(agent: KubeClient, namespace: str) -> None:
    assert agent.create_pod(
        {**pod("mine", AGENT_NODE), "metadata": {"name": "mine", "namespace": namespace}}
    )
    assert agent.delete_pod(namespace, "mine")


@pytest.mark.parametrize("node", ["worker-3", None], ids=["other-node", "unbound"])
def test_agent_may_not_create_a_pod_elsewhere(
    agent: KubeClient, namespace: str, node: str | None
) -> None:
    manifest = {**pod("theirs", node), "metadata": {"name": "theirs", "namespace": namespace}}

    with pytest.raises(ClusterRefused) as refused:
        agent.create_pod(manifest)

    assert refused.value.status == 403
    assert POLICY_MESSAGE in refused.value.message
    assert ("on worker-3" if node else "an unbound pod") in refused.value.message


def test_agent_may_not_delete_a_pod_on_another_node(
    agent: KubeClient, admin: KubeClient, namespace: str
) -> None:
    admin.core.create_namespaced_pod(namespace, pod("other", "worker-4"))

    with pytest.raises(ClusterRefused) as refused:
        agent.delete_pod(namespace, "other")

    assert refused.value.status == 403
    assert f"{POLICY_MESSAGE}, not on worker-4" in refused.value.message
    assert admin.core.read_namespaced_pod("other", namespace).metadata.deletion_timestamp is None


def test_the_policy_does_not_bind_other_users(admin: KubeClient, namespace: str) -> None:
    assert admin.create_pod(
        {**pod("admin", "worker-5"), "metadata": {"name": "admin", "namespace": namespace}}
    )


def test_an_unbound_agent_token_is_refused(admin: KubeClient, namespace: str) -> None:
    token = admin.core.create_namespaced_service_account_token(
        AGENT_SA, SYSTEM, {"spec": {"expirationSeconds": 600}}
    ).status.token
    unbound = admin.with_token(token)

    with pytest.raises(ClusterRefused, match="carries no node identity"):
        unbound.create_pod(
            {**pod("nobody", AGENT_NODE), "metadata": {"name": "nobody", "namespace": namespace}}
        )


@pytest.mark.parametrize(
    ("resource", "verb", "group", "allowed"),
    [
        ("pods", "create", "", True),
        ("pods", "delete", "", True),
        ("pods", "list", "", True),
        ("pods", "patch", "", False),
        ("pods", "deletecollection", "", False),
        ("pods/eviction", "create", "", False),
        ("edgenodes", "list", "lmedge.io", True),
        ("edgenodes", "patch", "lmedge.io", False),
        ("lmservices", "delete", "lmedge.io", False),
        ("configmaps", "create", "", False),
        ("nodes", "patch", "", False),
        ("secrets", "get", "", False),
    ],
)
def test_agent_rbac_is_least_privilege(
    agent: KubeClient, namespace: str, resource: str, verb: str, group: str, allowed: bool
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
    agent: KubeClient, admin: KubeClient, namespace: str
) -> None:
    custom = client.CustomObjectsApi(admin.api)
    for doc in yaml.safe_load_all((REPO / "examples/testbed/services.yaml").read_text()):
        if doc:
            custom.create_namespaced_custom_object(
                "lmedge.io", "v1alpha1", namespace, "lmservices", doc
            )
    settings = KubernetesSettings(namespace=namespace)
    lm2 = [LMPlacement(lm="lm2", mode="gpu", cpu_cores=2, vgpus=1)]

    mine = NodeAgent(
        AGENT_NODE, KubernetesBackend(agent, settings), Fixed(Placement(node=AGENT_NODE, lms=lm2))
    )
    ok = mine.step(0)
    # An agent misconfigured for another node cannot touch it.
    wrong = NodeAgent(
        "worker-3", KubernetesBackend(agent, settings), Fixed(Placement(node="worker-3", lms=lm2))
    )
    refused = wrong.step(0)

    assert (ok.actuation.started, ok.actuation.errors) == (["lm2"], [])
    assert refused.actuation.started == []
    assert len(refused.actuation.errors) == 1
    assert f"{POLICY_MESSAGE}, not on worker-3" in refused.actuation.errors[0]
    on_3 = admin.list_model_pods(namespace, node="worker-3")
    assert on_3 == []


class Fixed:
    name = "fixed"

    def __init__(self, placement: Placement) -> None:
        self.placement = placement

    def place(self, obs: NodeObservation) -> Decision[Placement]:
        return Decision[Placement](
            agent="deployer", policy="fixed", source="rule", value=self.placement
        )
