"""lmedge's one client of the Kubernetes API: the backend, the node agents, the
controller process and the operator's handlers all call it (the only other
importers of the `kubernetes` package are the live context's watch,
`lmedge.backends.kubernetes.live`, and kopf itself).

Every call has a timeout and is classified once, here:

- 429, 5xx, connection failures and timeouts are retried with exponential
  backoff, then raised as `ClusterUnavailable` (retryable);
- a 409 on create means the object already exists (the pod name is a
  function of the placement, so it is the pod we wanted) and is not an error;
  a 409 on anything else is a conflict, retried like a 429 (a Lease write is
  the exception: there a 409 is the answer "someone else wrote first");
- a 404 is `NotFound` (never retried here; on delete it means already gone);
- 400, 403, 422 and the rest are `ClusterRefused`: RBAC or the admission
  policy said no, or the object is invalid; retrying cannot help, and the
  message is the API server's.

`retryable` on those classes (`lmedge.errors`) is what the operator maps to
kopf's TemporaryError or PermanentError.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Mapping
from decimal import Decimal
from pathlib import Path
from typing import Any, TypeVar

import urllib3
import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.utils.quantity import parse_quantity as _parse_quantity

from lmedge.backends.kubernetes.pods import LABEL_LM, ObservedPod, observe_pod
from lmedge.errors import ClusterRefused, ClusterUnavailable, ConfigError, NotFound

__all__ = [
    "GROUP",
    "VERSION",
    "ClusterRefused",
    "KubeClient",
    "NotFound",
    "RetryPolicy",
    "parse_quantity",
]

log = logging.getLogger(__name__)

GROUP = "lmedge.io"
VERSION = "v1alpha1"
RETRYABLE = frozenset({409, 429, 500, 502, 503, 504})

T = TypeVar("T")


class RetryPolicy:
    """Attempts and delays of one call.

    `attempts` (default 5) tries in all; the delay doubles from `backoff_s`
    (default 0.2 s) up to `max_backoff_s` (2 s), so a throttled call gives up
    after about 3 s — well inside a 30 s slot. `timeout_s` (default 10 s) is
    the per-request read timeout; connecting gets `connect_timeout_s` (3 s).
    """

    def __init__(
        self,
        attempts: int = 5,
        backoff_s: float = 0.2,
        max_backoff_s: float = 2.0,
        timeout_s: float = 10.0,
        connect_timeout_s: float = 3.0,
    ) -> None:
        self.attempts = max(1, attempts)
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.timeout = (connect_timeout_s, timeout_s)

    def delay(self, attempt: int) -> float:
        return float(min(self.max_backoff_s, self.backoff_s * 2**attempt))


def _message(exc: ApiException) -> str:
    try:
        body = json.loads(exc.body or "{}")
    except (TypeError, ValueError):
        return str(exc.reason)
    return str(body.get("message") or exc.reason) if isinstance(body, dict) else str(exc.reason)


class KubeClient:
    """Typed calls the backend, node agent and controller process make."""

    def __init__(self, api: client.ApiClient, retry: RetryPolicy | None = None) -> None:
        self.api = api
        self.retry = retry or RetryPolicy()
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.coordination = client.CoordinationV1Api(api)
        self.authentication = client.AuthenticationV1Api(api)

    # -- construction -------------------------------------------------------

    @classmethod
    def connect(
        cls, kubeconfig: str | Path | None = None, token_file: Path | None = None
    ) -> KubeClient:
        """In-cluster config in a pod, else the kubeconfig (`$KUBECONFIG`, ~/.kube/config).

        `token_file` replaces the credentials with a bearer token read from
        that file (e.g. a projected, Pod-bound service-account token).
        """
        cfg = client.Configuration()
        # The client reads $KUBECONFIG once, at import; read it now.
        path = str(kubeconfig) if kubeconfig else os.environ.get("KUBECONFIG")
        try:
            if kubeconfig is None:
                try:
                    config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
                except config.ConfigException:
                    config.load_kube_config(config_file=path, client_configuration=cfg)  # type: ignore[no-untyped-call]
            else:
                config.load_kube_config(config_file=path, client_configuration=cfg)  # type: ignore[no-untyped-call]
        except (config.ConfigException, OSError) as exc:
            raise ConfigError(f"no Kubernetes configuration: {_one_line(exc)}") from exc
        except (yaml.YAMLError, TypeError, ValueError, KeyError, AttributeError) as exc:
            # The client's loader trusts the file's shape: a malformed kubeconfig
            # surfaces as whatever its parsing trips over. A user mistake, one line.
            where = path or "~/.kube/config"
            raise ConfigError(f"kubeconfig {where} is not valid: {_one_line(exc)}") from exc
        if token_file is not None:
            try:
                token = token_file.read_text().strip()
            except OSError as exc:
                raise ConfigError(f"token file {token_file}: {exc.strerror or exc}") from exc
            cfg.api_key = {"authorization": "Bearer " + token}
            cfg.cert_file = cfg.key_file = None
        try:
            api = client.ApiClient(cfg)
        except ValueError as exc:  # e.g. a server URL that does not parse
            raise ConfigError(f"kubeconfig {path or '~/.kube/config'}: {_one_line(exc)}") from exc
        return cls(api)

    def with_token(self, token: str) -> KubeClient:
        """A client for the same server that authenticates with `token` instead."""
        src = self.api.configuration
        cfg = client.Configuration()
        cfg.host = src.host
        cfg.ssl_ca_cert = src.ssl_ca_cert
        cfg.verify_ssl = src.verify_ssl
        cfg.api_key = {"authorization": "Bearer " + token}
        return KubeClient(client.ApiClient(cfg), self.retry)

    def close(self) -> None:
        self.api.close()  # type: ignore[no-untyped-call]

    # -- the retry boundary -------------------------------------------------

    def call(self, action: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Call `fn` with a timeout, retrying the transient failures (module doc)."""
        attempt = 0
        while True:
            try:
                return fn(*args, _request_timeout=self.retry.timeout, **kwargs)
            except ApiException as exc:
                if exc.status == 404:
                    raise NotFound(f"{action}: not found") from exc
                if exc.status and exc.status not in RETRYABLE:
                    raise ClusterRefused(action, exc.status, _message(exc)) from exc
                failure: Exception = exc
                why = f"HTTP {exc.status} {_message(exc)}"
            except (urllib3.exceptions.HTTPError, OSError) as exc:
                failure, why = exc, f"{type(exc).__name__}: {exc}"
            attempt += 1
            if attempt >= self.retry.attempts:
                raise ClusterUnavailable(f"{action}: {why}") from failure
            log.debug("%s failed (%s); retry %d", action, why, attempt)
            time.sleep(self.retry.delay(attempt - 1))

    def _json(self, obj: Any) -> Any:
        return self.api.sanitize_for_serialization(obj)  # type: ignore[no-untyped-call]

    # -- authentication -----------------------------------------------------

    def review_token(self, token: str, audiences: list[str]) -> dict[str, Any]:
        """The API server's TokenReview `status` for `token` and `audiences`.

        Keys as in the API: `authenticated`, `user` (`username`, `extra`),
        `audiences` (those of `audiences` the token carries), `error`.
        """
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": {"token": token, "audiences": audiences},
        }
        out: Any = self.call("review a bearer token", self.authentication.create_token_review, body)
        status: dict[str, Any] = self._json(out).get("status") or {}
        return status

    # -- lmedge resources ---------------------------------------------------

    def list_edge_nodes(self) -> list[dict[str, Any]]:
        out: Any = self.call(
            "list EdgeNodes", self.custom.list_cluster_custom_object, GROUP, VERSION, "edgenodes"
        )
        return list(out.get("items", []))

    def list_lmservices(self, namespace: str) -> list[dict[str, Any]]:
        out: Any = self.call(
            f"list LMServices in {namespace}",
            self.custom.list_namespaced_custom_object,
            GROUP,
            VERSION,
            namespace,
            "lmservices",
        )
        return list(out.get("items", []))

    def delete_lmservice(self, namespace: str, name: str) -> bool:
        """Delete an LMService (its finalizer is the operator's to release); False when gone."""
        try:
            self.call(
                f"delete LMService {namespace}/{name}",
                self.custom.delete_namespaced_custom_object,
                GROUP,
                VERSION,
                namespace,
                "lmservices",
                name,
            )
        except NotFound:
            return False
        return True

    # -- Nodes and ConfigMaps (the operator's) --------------------------------

    def node_allocatable(self, name: str) -> dict[str, str]:
        """The Node's `status.allocatable` (NotFound when there is no such Node)."""
        node: Any = self.call(f"read Node {name}", self.core.read_node, name)
        return dict((node.status.allocatable if node.status else None) or {})

    def label_node(self, name: str, labels: Mapping[str, str | None]) -> None:
        """Merge-patch labels onto a Node; a None value removes the label."""
        body = {"metadata": {"labels": dict(labels)}}
        self.call(f"label Node {name}", self.core.patch_node, name, body)

    def list_nodes(self) -> list[dict[str, Any]]:
        """Every Node as its JSON object (health: Ready condition, spec.unschedulable)."""
        out: Any = self.call("list Nodes", self.core.list_node)
        return [self._json(n) for n in out.items]

    def set_configmap_data(self, namespace: str, name: str, data: Mapping[str, str]) -> bool:
        """Make the ConfigMap's data exactly `data` (created when missing); True if it changed.

        Keys no longer in `data` are removed (a merge patch with null values),
        others are left alone, so RBAC needs only get and patch on this name
        when the chart created the ConfigMap.
        """
        where = f"ConfigMap {namespace}/{name}"
        try:
            live: Any = self.call(
                f"read {where}", self.core.read_namespaced_config_map, name, namespace
            )
        except NotFound:
            body: Any = {"metadata": {"name": name, "namespace": namespace}, "data": dict(data)}
            self.call(f"create {where}", self.core.create_namespaced_config_map, namespace, body)
            return True
        current = dict(live.data or {})
        if current == dict(data):
            return False
        patch: dict[str, str | None] = {k: None for k in current if k not in data}
        patch.update(data)
        self.call(
            f"patch {where}",
            self.core.patch_namespaced_config_map,
            name,
            namespace,
            {"data": patch},
        )
        return True

    def apply_configmap(self, manifest: Mapping[str, Any]) -> None:
        """Create the ConfigMap, or patch it with `manifest` when it exists."""
        meta = manifest["metadata"]
        where = f"ConfigMap {meta['namespace']}/{meta['name']}"
        body: Any = dict(manifest)
        try:
            self.call(f"apply {where}", self._create_configmap_once, meta["namespace"], body)
        except _AlreadyExists:
            self.call(
                f"apply {where}",
                self.core.patch_namespaced_config_map,
                meta["name"],
                meta["namespace"],
                body,
            )

    def _create_configmap_once(self, namespace: str, body: Any, **kwargs: Any) -> Any:
        try:
            return self.core.create_namespaced_config_map(namespace, body, **kwargs)
        except ApiException as exc:
            if exc.status == 409 and "AlreadyExists" in (exc.body or ""):
                raise _AlreadyExists from exc
            raise

    # -- model pods ---------------------------------------------------------

    def list_model_pods(self, namespace: str | None, node: str | None = None) -> list[ObservedPod]:
        """Model pods in `namespace` (every namespace when None; on `node` only, when given)."""
        kwargs: dict[str, str] = {"label_selector": LABEL_LM}
        if node is not None:
            kwargs["field_selector"] = f"spec.nodeName={node}"
        if namespace is None:
            pods: Any = self.call(
                "list model pods", self.core.list_pod_for_all_namespaces, **kwargs
            )
        else:
            pods = self.call(
                f"list model pods in {namespace}",
                self.core.list_namespaced_pod,
                namespace,
                **kwargs,
            )
        return [observe_pod(self._json(p)) for p in pods.items]

    def create_pod(self, manifest: Mapping[str, Any]) -> bool:
        """Create a pod; False when one of that name already exists."""
        meta = manifest["metadata"]
        try:
            self.call(
                f"create pod {meta['namespace']}/{meta['name']}",
                self._create_pod_once,
                meta["namespace"],
                manifest,
            )
        except _AlreadyExists:
            return False
        return True

    def _create_pod_once(self, namespace: str, manifest: Any, **kwargs: Any) -> Any:
        try:
            return self.core.create_namespaced_pod(namespace, manifest, **kwargs)
        except ApiException as exc:
            # AlreadyExists is a 409 too, but not a conflict worth retrying.
            if exc.status == 409 and "AlreadyExists" in (exc.body or ""):
                raise _AlreadyExists from exc
            raise

    def delete_pod(self, namespace: str, name: str, grace_s: int | None = None) -> bool:
        """Delete a pod; False when it was already gone."""
        try:
            self.call(
                f"delete pod {namespace}/{name}",
                self.core.delete_namespaced_pod,
                name,
                namespace,
                grace_period_seconds=grace_s,
            )
        except NotFound:
            return False
        return True

    # -- leases (leader election) ---------------------------------------------

    def read_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The Lease as JSON, or None when it does not exist."""
        try:
            lease = self.call(
                f"read Lease {namespace}/{name}",
                self.coordination.read_namespaced_lease,
                name,
                namespace,
            )
        except NotFound:
            return None
        out: dict[str, Any] = self._json(lease)
        return out

    def write_lease(self, namespace: str, body: dict[str, Any]) -> bool:
        """Create the Lease, or replace it at its resourceVersion; False on a lost race.

        Optimistic concurrency is the point here, so a 409 is an answer
        (someone else wrote first), not something to retry.
        """
        name = body["metadata"]["name"]
        lease: Any = body  # the client serializes plain dicts as they are
        try:
            if body["metadata"].get("resourceVersion"):
                self.coordination.replace_namespaced_lease(
                    name, namespace, lease, _request_timeout=self.retry.timeout
                )
            else:
                self.coordination.create_namespaced_lease(
                    namespace, lease, _request_timeout=self.retry.timeout
                )
        except ApiException as exc:
            if exc.status == 409:
                return False
            if exc.status and exc.status not in RETRYABLE:
                raise ClusterRefused(
                    f"write Lease {namespace}/{name}", exc.status, _message(exc)
                ) from exc
            raise ClusterUnavailable(f"write Lease {namespace}/{name}: HTTP {exc.status}") from exc
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise ClusterUnavailable(f"write Lease {namespace}/{name}: {exc}") from exc
        return True


class _AlreadyExists(Exception):
    pass


def parse_quantity(value: str | int | float) -> Decimal:
    """A Kubernetes resource quantity ("16", "250m", "24Gi") as a number (the client's parser)."""
    return Decimal(_parse_quantity(value))  # type: ignore[no-untyped-call]


def _one_line(exc: BaseException) -> str:
    """An exception's message on one line (YAML errors span several)."""
    return " ".join(str(exc).split()) or type(exc).__name__
