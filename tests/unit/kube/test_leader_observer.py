"""Lease expiry on the candidate's own clock (client-go's observedTime), as pure logic."""

from __future__ import annotations

from lmedge.backends.kubernetes.leader import LeaseObserver

A = ("leader", 15, "2026-01-01T00:00:00.000000Z", "2026-01-01T00:00:00.000000Z", 1)
# The leader's next renewal, stamped by a wall clock a day behind: only "changed" counts.
A_RENEWED = ("leader", 15, "2026-01-01T00:00:00.000000Z", "2025-12-31T00:00:05.000000Z", 1)


def test_an_unchanged_record_expires_one_duration_after_it_was_first_seen() -> None:
    seen = LeaseObserver(duration_s=15)
    seen.observe(A, now=100.0)
    seen.observe(A, now=110.0)
    assert not seen.expired(115.0)
    assert seen.expired(115.1)


def test_every_change_restarts_the_clock_whatever_its_timestamps_say() -> None:
    seen = LeaseObserver(duration_s=15)
    seen.observe(A, now=100.0)
    seen.observe(A_RENEWED, now=114.0)  # renewed (its renewTime is "older" than before)
    assert not seen.expired(128.0)
    assert seen.expired(129.5)


def test_a_lease_first_seen_now_is_not_expired_however_old_its_stamps() -> None:
    seen = LeaseObserver(duration_s=15)
    seen.observe(("old", 15, "1970-01-01T00:00:00Z", "1970-01-01T00:00:00Z", 9), now=5000.0)
    assert not seen.expired(5010.0)
