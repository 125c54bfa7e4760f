"""Leader election on a `coordination.k8s.io/v1` Lease, as client-go does it.

One controller replica holds the Lease and renews it every `renew_s`; the
others try every `retry_s` and take it over once it has not been renewed for
`duration_s`. Writes use the Lease's resourceVersion, so two candidates can
never both win the same round (the loser gets a 409).

A leader that cannot renew within `duration_s` must stop acting: by then
another replica may have taken over. `LeaseElector.lost` is set at that
moment and the controller process exits (its Deployment restarts it as a
candidate) — the same contract as client-go's `OnStoppedLeading`.

Why a Lease and not kopf peering: peering pauses only kopf's handlers, while
the planner and scheduler loop must pause with them; and a Lease is the
standard object operators and `kubectl` already understand.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from lmedge.backends.kubernetes.client import KubeClient
from lmedge.errors import LmedgeError

__all__ = ["LeaseElector"]

log = logging.getLogger(__name__)

_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"


def _now() -> datetime:
    return datetime.now(UTC)


def _stamp(t: datetime) -> str:
    return t.strftime(_FORMAT)


def _parse(value: Any) -> datetime | None:
    if not value:
        return None
    text = str(value).replace("+00:00", "Z")
    for fmt in (_FORMAT, "%Y-%m-%dT%H:%M:%SZ"):
        try:
            return datetime.strptime(text, fmt).replace(tzinfo=UTC)
        except ValueError:
            continue
    return None


class LeaseElector:
    """Acquire and keep the Lease `namespace/name` for `identity`.

    Defaults follow client-go: `duration_s` 15 s, `renew_s` 5 s (renew well
    before expiry), `retry_s` 2 s between attempts of a candidate.
    """

    def __init__(
        self,
        kube: KubeClient,
        namespace: str,
        name: str = "lmedge-controller",
        identity: str | None = None,
        duration_s: float = 15.0,
        renew_s: float = 5.0,
        retry_s: float = 2.0,
    ) -> None:
        self.kube = kube
        self.namespace = namespace
        self.name = name
        self.identity = identity or f"{socket.gethostname()}-{uuid.uuid4().hex[:6]}"
        self.duration_s = duration_s
        self.renew_s = renew_s
        self.retry_s = retry_s
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._renewed_at = 0.0
        self._thread: threading.Thread | None = None

    def try_acquire(self) -> bool:
        """One round: take a free or expired Lease, renew our own; True if we hold it."""
        lease = self.kube.read_lease(self.namespace, self.name)
        now = _now()
        spec: dict[str, Any] = dict((lease or {}).get("spec") or {})
        holder = spec.get("holderIdentity")
        renewed = _parse(spec.get("renewTime")) or _parse(spec.get("acquireTime"))
        duration = float(spec.get("leaseDurationSeconds") or self.duration_s)
        expired = renewed is None or now > renewed + timedelta(seconds=duration)
        if lease is not None and holder not in (None, "", self.identity) and not expired:
            return False
        ours = holder == self.identity
        body: dict[str, Any] = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": int(self.duration_s),
                "acquireTime": spec.get("acquireTime") if ours else _stamp(now),
                "renewTime": _stamp(now),
                "leaseTransitions": int(spec.get("leaseTransitions") or 0) + (0 if ours else 1),
            },
        }
        if lease is not None:
            body["metadata"]["resourceVersion"] = lease["metadata"]["resourceVersion"]
        if self.kube.write_lease(self.namespace, body):
            self._renewed_at = time.monotonic()
            return True
        return False

    def acquire(self, stop: threading.Event | None = None) -> bool:
        """Block until we lead (True) or `stop` is set (False); then keep renewing."""
        stop = stop or threading.Event()
        while not stop.is_set():
            try:
                if self.try_acquire():
                    log.info(
                        "leading as %s (Lease %s/%s)", self.identity, self.namespace, self.name
                    )
                    self._thread = threading.Thread(
                        target=self._renew_loop, name="lease-renew", daemon=True
                    )
                    self._thread.start()
                    return True
            except LmedgeError as exc:
                log.warning("leader election: %s", exc)
            stop.wait(self.retry_s)
        return False

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.renew_s):
            try:
                if self.try_acquire():
                    continue
                log.error("Lease %s/%s taken by another replica", self.namespace, self.name)
            except LmedgeError as exc:
                if time.monotonic() - self._renewed_at < self.duration_s:
                    log.warning("Lease renewal failed, retrying: %s", exc)
                    continue
                log.error("Lease not renewed for %.0f s: %s", self.duration_s, exc)
            self.lost.set()
            return

    def release(self) -> None:
        """Stop renewing and hand the Lease back (expired at once) if we still hold it."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.renew_s + 1)
        if self.lost.is_set():
            return
        try:
            lease = self.kube.read_lease(self.namespace, self.name)
            if lease and (lease.get("spec") or {}).get("holderIdentity") == self.identity:
                lease["spec"]["holderIdentity"] = ""
                lease["spec"]["renewTime"] = None
                lease["spec"]["acquireTime"] = None
                self.kube.write_lease(self.namespace, lease)
        except LmedgeError as exc:
            log.warning("could not release the Lease: %s", exc)
