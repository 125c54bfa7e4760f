"""The Kubernetes backend's thin client: the only module of the backend that
imports the `kubernetes` package.

Every call has a timeout and is classified once:

- 429, 5xx, connection failures and timeouts are retried with exponential
  backoff, then raised as `ClusterUnavailable` (retryable);
- a 409 on create means the object already exists (the pod name is a
  function of the placement, so it is the pod we wanted) and is not an error;
  a 409 on anything else is a conflict, retried like a 429;
- a 404 on delete means it is already gone;
- 403 and 422 are `ClusterRefused`: RBAC or the admission policy said no, or
  the object is invalid; retrying cannot help, and the message is the API
  server's.

There are no watches here: the backend and the node agent list what they need
each slot, so a dropped watch can lose no state. (kopf keeps its own watches
and re-establishes them.)
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import urllib3
import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from lmedge.backends.kubernetes.pods import LABEL_LM, ObservedPod, observe_pod
from lmedge.errors import ClusterUnavailable, ConfigError, LmedgeError

__all__ = ["GROUP", "VERSION", "ClusterRefused", "KubeClient", "RetryPolicy"]

log = logging.getLogger(__name__)

GROUP = "lmedge.io"
VERSION = "v1alpha1"
RETRYABLE = frozenset({409, 429, 500, 502, 503, 504})

T = TypeVar("T")


class ClusterRefused(LmedgeError):
    """The API server refused the request (RBAC, admission or validation)."""

    def __init__(self, action: str, status: int, message: str) -> None:
        self.status = status
        self.message = message
        super().__init__(f"{action}: HTTP {status}: {message}")


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
                    raise
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

    # -- model pods ---------------------------------------------------------

    def list_model_pods(self, namespace: str, node: str | None = None) -> list[ObservedPod]:
        """Model pods in `namespace` (on `node` only, when given)."""
        kwargs: dict[str, str] = {"label_selector": LABEL_LM}
        if node is not None:
            kwargs["field_selector"] = f"spec.nodeName={node}"
        pods: Any = self.call(
            f"list model pods in {namespace}", self.core.list_namespaced_pod, namespace, **kwargs
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
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
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
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
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


def _one_line(exc: BaseException) -> str:
    """An exception's message on one line (YAML errors span several)."""
    return " ".join(str(exc).split()) or type(exc).__name__
