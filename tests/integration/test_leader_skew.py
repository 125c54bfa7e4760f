"""Leader election under clock skew, against the real test API server.

Edge sites' wall clocks disagree. With client-go's semantics a candidate
judges expiry on its own monotonic clock (the record unchanged for a lease
duration), so a constant wall-clock offset of minutes, hours or a day between
the leader and a candidate never yields two leaders, and a crashed leader is
still replaced. (Before, the candidate compared the leader's `renewTime`
with its own wall clock: a candidate 5 minutes ahead took over a healthy
leader at its first try.)
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta

import pytest

from lmedge.backends.kubernetes.client import KubeClient
from lmedge.backends.kubernetes.leader import LeaseElector
from tests.fixtures.cluster import KubeCluster, wait_until

NAMESPACE = "default"
#: Generous against a loaded 2-core machine: a renewal may be late by seconds.
DURATION_S, RENEW_S = 8.0, 1.0

#: (leader's wall-clock offset, candidate's), seconds.
SKEWS = [(-300, 300), (300, -300), (0, -3600), (-86_400, 0)]
IDS = ["leader-5min-behind", "leader-5min-ahead", "candidate-1h-behind", "leader-1day-behind"]


@pytest.fixture
def kube(kube_cluster: KubeCluster) -> Iterator[KubeClient]:
    k = KubeClient.connect(kube_cluster.kubeconfig)
    yield k
    k.close()


def skewed(offset_s: float) -> Callable[[], datetime]:
    return lambda: datetime.now(UTC) + timedelta(seconds=offset_s)


def holder(kube: KubeClient, name: str) -> str | None:
    lease = kube.read_lease(NAMESPACE, name)
    return None if lease is None else (lease.get("spec") or {}).get("holderIdentity")


@pytest.mark.parametrize(("leader_skew", "candidate_skew"), SKEWS, ids=IDS)
def test_skewed_clocks_never_make_two_leaders_and_a_crash_still_hands_over(
    kube: KubeClient, leader_skew: float, candidate_skew: float
) -> None:
    name = f"skew-{uuid.uuid4().hex[:6]}"
    common = {"duration_s": DURATION_S, "renew_s": RENEW_S, "retry_s": 0.2}
    leader = LeaseElector(kube, NAMESPACE, name, "leader", wall=skewed(leader_skew), **common)
    candidate = LeaseElector(
        kube, NAMESPACE, name, "candidate", wall=skewed(candidate_skew), **common
    )
    assert leader.acquire()
    try:
        # Two lease durations of a live, renewing leader: the candidate never wins.
        end = time.monotonic() + 2 * DURATION_S
        tries = 0
        while time.monotonic() < end:
            assert candidate.try_acquire() is False
            tries += 1
            time.sleep(0.2)
        assert tries > 10 and not leader.lost.is_set() and holder(kube, name) == "leader"
    finally:
        leader._stop.set()  # the leader crashes: no more renewals, no release
        if leader._thread is not None:
            leader._thread.join(timeout=RENEW_S + 5)

    wait_until(candidate.try_acquire, 4 * DURATION_S, "the candidate to take over")
    assert holder(kube, name) == "candidate"
