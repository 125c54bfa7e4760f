"""Leader election on a `coordination.k8s.io/v1` Lease, as client-go does it.

One controller replica holds the Lease and renews it every `renew_s`; the
others try every `retry_s` and take it over once it has not been renewed for
`duration_s`. Writes use the Lease's resourceVersion, so two candidates can
never both win the same round (the loser gets a 409).

"Not renewed for `duration_s`" is judged on the candidate's own clock, never
by comparing the holder's `renewTime` with it (client-go's `observedTime`):
a candidate remembers the record it last read and the local monotonic time
at which that record last changed, and the Lease is expired only when the
record has not changed for `duration_s` of the candidate's time. The
timestamps in the record are the writer's wall clock and are only ever
compared for change, so any constant offset between the replicas' wall
clocks (edge sites minutes or hours apart) cannot make two leaders; only the
clocks' rates matter, which is what the gap between `renew_s` and
`duration_s` absorbs.

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
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from lmedge.backends.kubernetes.client import KubeClient
from lmedge.errors import LmedgeError

__all__ = ["LeaseElector", "LeaseObserver"]

log = logging.getLogger(__name__)

_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"


def _wall_now() -> datetime:
    return datetime.now(UTC)


def _stamp(t: datetime) -> str:
    return t.strftime(_FORMAT)


#: What identifies one write of a Lease: its spec's fields (client-go compares the raw record).
Record = tuple[Any, ...]


def _record(lease: dict[str, Any] | None) -> Record | None:
    if lease is None:
        return None
    spec = lease.get("spec") or {}
    keys = (
        "holderIdentity",
        "leaseDurationSeconds",
        "acquireTime",
        "renewTime",
        "leaseTransitions",
    )
    return tuple(spec.get(k) for k in keys)


@dataclass
class LeaseObserver:
    """The record a candidate last read, and when (on its own monotonic clock) it changed.

    `expired(now)` is client-go's `!isLeaseValid`: the record has not changed
    for `duration_s` of local time. Pure: the time is passed in.
    """

    duration_s: float
    record: Record | None = None
    changed_at: float = 0.0

    def observe(self, record: Record | None, now: float) -> None:
        """Note the record read at local time `now` (a new one restarts the clock)."""
        if record != self.record:
            self.record = record
            self.changed_at = now

    def expired(self, now: float) -> bool:
        return now > self.changed_at + self.duration_s


class LeaseElector:
    """Acquire and keep the Lease `namespace/name` for `identity`.

    Defaults follow client-go: `duration_s` 15 s, `renew_s` 5 s (renew well
    before expiry), `retry_s` 2 s between attempts of a candidate. `clock`
    (monotonic seconds) measures expiry; `wall` stamps the times written in
    the Lease, which only people and change detection read (both injectable,
    e.g. to test skewed clocks).
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
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = _wall_now,
    ) -> None:
        self.kube = kube
        self.namespace = namespace
        self.name = name
        self.identity = identity or f"{socket.gethostname()}-{uuid.uuid4().hex[:6]}"
        self.duration_s = duration_s
        self.renew_s = renew_s
        self.retry_s = retry_s
        self.clock = clock
        self.wall = wall
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._observed = LeaseObserver(duration_s)
        self._renewed_at = 0.0
        self._thread: threading.Thread | None = None

    def try_acquire(self) -> bool:
        """One round: take a free or expired Lease, renew our own; True if we hold it."""
        lease = self.kube.read_lease(self.namespace, self.name)
        now = self.clock()
        self._observed.observe(_record(lease), now)
        spec: dict[str, Any] = dict((lease or {}).get("spec") or {})
        holder = spec.get("holderIdentity")
        ours = holder == self.identity
        if lease is not None and holder and not ours and not self._observed.expired(now):
            return False
        stamp = _stamp(self.wall())
        body: dict[str, Any] = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": max(1, round(self.duration_s)),
                "acquireTime": spec.get("acquireTime") if ours else stamp,
                "renewTime": stamp,
                "leaseTransitions": int(spec.get("leaseTransitions") or 0) + (0 if ours else 1),
            },
        }
        if lease is not None:
            body["metadata"]["resourceVersion"] = lease["metadata"]["resourceVersion"]
        if self.kube.write_lease(self.namespace, body):
            self._renewed_at = self.clock()
            self._observed.observe(_record(body), self._renewed_at)
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
                if self.clock() - self._renewed_at < self.duration_s:
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
