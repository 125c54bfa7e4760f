"""The store contract: the same assertions on the embedded store and on FerretDB."""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path

import pytest

from lmedge.api.decisions import WINDOW_TRIGGER, Decision, RoutingMap, WindowAudit
from lmedge.api.observations import LMStats
from lmedge.api.totals import LoadBalanceStats, RunTotals, WindowTotals
from lmedge.errors import StoreError, StoreUnavailable, UserError
from lmedge.store import Store, StoreOptions, open_store

from . import samples


def test_every_document_kind_round_trips(store: Store) -> None:
    run = samples.run_info("r1")
    store.record_run(run)
    written = samples.decisions("r1", epochs=1, slots=1)
    for d in written:
        store.record_decision(d)
    reqs = samples.requests("r1", 12)
    store.record_requests(reqs)
    snap = samples.telemetry("r1", "a", 30.0)
    store.record_telemetry([snap])
    case = samples.memory("r1", 1, 0.375)
    store.record_memory(case)

    assert store.runs() == [run]
    assert store.decisions(run="r1", limit=100) == written[::-1]
    assert list(store.requests("r1")) == reqs
    assert store.telemetry(node="a") == [snap]
    assert store.memory_cases(run="r1") == [case]
    assert store.runs()[0].started == samples.T0  # timezone-aware, microseconds kept


def test_decision_filters_limits_and_newest_first(store: Store) -> None:
    store.record_run(samples.run_info("r1"))
    store.record_run(samples.run_info("r2", minutes=5))
    for d in samples.decisions("r1") + samples.decisions("r2", epochs=1):
        store.record_decision(d)

    latest = store.decisions(limit=3)
    assert [(d.run, d.agent, d.slot, d.node) for d in latest] == [
        ("r2", "deployer", 2, "c"),
        ("r2", "deployer", 2, "b"),
        ("r2", "deployer", 2, "a"),
    ]
    planner = store.decisions(agent="planner", run="r1")
    assert [(d.epoch, d.value.rationale) for d in planner] == [(1, "epoch 1"), (0, "epoch 0")]
    slot4 = store.decisions(run="r1", slot=4)
    assert [d.agent for d in slot4] == ["deployer"] * 3 + ["scheduler"]
    node_b = store.decisions(agent="deployer", run="r1", epoch=1, node="b")
    assert [(d.slot, d.node) for d in node_b] == [(5, "b"), (4, "b"), (3, "b")]
    assert node_b[0].outcome == "replaced" and node_b[0].violations == ["vram: 3 vGPUs > 2"]
    assert store.decisions(run="r1", epoch=7) == []
    assert len(store.decisions(run="r1", limit=1000)) == 2 + 6 * 4


def test_batched_decisions_read_back_like_single_ones(store: Store) -> None:
    store.record_run(samples.run_info("r1"))
    batch = samples.decisions("r1")
    store.record_decisions(batch)
    stored = store.decisions(run="r1", limit=1000)
    assert len(stored) == len(batch) == 2 + 6 * 4
    assert sorted((d.agent, d.epoch, d.slot, d.node or "") for d in stored) == sorted(
        (d.agent, d.epoch, d.slot, d.node or "") for d in batch
    )
    assert [d.agent for d in store.decisions(run="r1", slot=4)] == ["deployer"] * 3 + ["scheduler"]


def test_requests_stream_in_submit_order_and_filter_by_lm(store: Store) -> None:
    store.record_run(samples.run_info("r1"))
    store.record_run(samples.run_info("r2"))
    reqs = samples.requests("r1", 1200)
    store.record_requests(reversed(reqs))  # arrival order must not matter
    store.record_requests(samples.requests("r2", 30))

    assert [r.id for r in store.requests("r1")] == [r.id for r in reqs]
    phi = list(store.requests("r1", lm="phi"))
    assert len(phi) == 400 and {r.lm for r in phi} == {"phi"}


def test_lm_stats_match_the_records(store: Store) -> None:
    store.record_run(samples.run_info("r1"))
    reqs = samples.requests("r1", 997)
    store.record_requests(reqs)
    store.record_requests(samples.requests("other", 50))  # must not leak in

    expected: dict[str, list[float]] = defaultdict(lambda: [0, 0, 0.0])
    for r in reqs:
        acc = expected[r.lm]
        acc[0] += 1
        if r.outcome == "success":
            acc[1] += 1
            acc[2] += r.latency_s
    stats = store.lm_stats("r1")
    assert [s.lm for s in stats] == sorted(expected)
    for s in stats:
        arrivals, successes, latency = expected[s.lm]
        assert (s.arrivals, s.successes) == (arrivals, successes)
        assert s.success_ratio == pytest.approx(successes / arrivals)
        assert s.mean_latency_s == pytest.approx(latency / successes)


def test_lm_stats_of_a_run_without_successes(store: Store) -> None:
    store.record_run(samples.run_info("r1"))
    store.record_requests(r for r in samples.requests("r1", 40) if r.outcome == "timeout")
    assert store.lm_stats("r1")[0] == LMStats(
        lm="llama", arrivals=3, successes=0, success_ratio=0.0, mean_latency_s=None
    )


def test_replayed_and_overlapping_batches_store_each_record_once(store: Store) -> None:
    store.record_run(samples.run_info("r1"))
    reqs = samples.requests("r1", 1500)
    store.record_requests(reqs[200:700])  # a batch that got through before an outage
    store.record_requests(reqs)  # the whole backlog replayed
    store.record_requests(reqs[:3] + reqs[:3])  # duplicates inside one batch
    ids = [r.id for r in store.requests("r1")]
    assert len(ids) == len(set(ids)) == 1500
    store.record_run(samples.run_info("r1", minutes=9))  # first registration wins...
    assert store.runs()[0].started == samples.T0
    assert store.buffer_stats().conflicts == 1  # ...and the other one is reported
    assert store.buffer_stats().refused == 0
    assert store.status().counts["requests"] == 1500


def test_telemetry_and_memory_orderings(store: Store) -> None:
    store.record_run(samples.run_info("r1"))
    store.record_telemetry(
        samples.telemetry("r1", n, float(t)) for t in range(0, 300, 30) for n in samples.NODES
    )
    latest_b = store.telemetry(node="b", limit=3)
    assert [(s.node, s.time_s) for s in latest_b] == [("b", 270.0), ("b", 240.0), ("b", 210.0)]
    assert len(store.telemetry(run="r1", limit=100)) == 30

    for epoch, objective in [(0, 0.25), (1, None), (2, 0.75), (3, 0.5), (4, 0.125)]:
        store.record_memory(samples.memory("r1", epoch, objective))
    store.record_memory(samples.memory("r2", 0, 0.01))
    # Lower J is better: with a limit the worst epochs are left out, never the best.
    best = store.memory_cases(run="r1", limit=3)
    assert [(c.epoch, c.objective) for c in best] == [(4, 0.125), (0, 0.25), (3, 0.5)]
    every = store.memory_cases(run="r1", limit=0)
    assert [c.epoch for c in every] == [4, 0, 3, 2, 1], "unscored cases come last"
    assert [c.epoch for c in store.memory_cases(run="r1", limit=5)] == [4, 0, 3, 2, 1]
    assert store.memory_cases(limit=1)[0].run == "r2", "across runs, the best first"


def test_runs_and_status(store: Store) -> None:
    for i, run in enumerate(["old", "new", "mid"]):
        store.record_run(samples.run_info(run, minutes={"old": 0, "new": 20, "mid": 10}[run]))
        store.record_requests(samples.requests(run, 10 + i))
    assert [r.id for r in store.runs()] == ["new", "mid", "old"]
    status = store.status()
    assert status.counts["runs"] == 3 and status.counts["requests"] == 33
    assert status.counts["macro_policies"] == 0
    assert status.latest_run is not None and status.latest_run.id == "new"
    assert status.buffer.pending == 0
    assert status.validators is False and status.ttl is False  # neither backend has them


def test_empty_store_and_unknown_run_are_user_errors(store: Store) -> None:
    with pytest.raises(StoreError, match="is empty: no run has been recorded"):
        store.status()
    with pytest.raises(StoreError, match="is empty"):
        store.runs()
    with pytest.raises(StoreError, match="is empty"):
        store.lm_stats("r1")
    store.record_run(samples.run_info("r1"))
    store.record_requests(samples.requests("r1", 3))
    with pytest.raises(StoreError, match=r"no run 'r9' in .* \(runs: r1\)"):
        list(store.requests("r9"))
    with pytest.raises(StoreError, match="no run 'r9'"):
        store.decisions(run="r9")
    assert store.decisions(run="r1") == []  # a known run without decisions is fine


def test_reopened_store_reads_the_same_documents(store_uri_param: str, tmp_path: Path) -> None:
    options = StoreOptions(spill_dir=tmp_path / "spill")
    with open_store(store_uri_param, options=options) as first:
        first.record_run(samples.run_info("r1"))
        first.record_requests(samples.requests("r1", 20))
        for d in samples.decisions("r1", epochs=1, slots=1):
            first.record_decision(d)
    with open_store(store_uri_param, options=options, read_only=True) as again:
        assert [r.id for r in again.runs()] == ["r1"]
        assert len(list(again.requests("r1"))) == 20
        assert [d.agent for d in again.decisions(run="r1")][-1] == "planner"


@pytest.mark.parametrize(
    ("uri", "message"),
    [
        ("", "the store setting is empty"),
        ("postgres://db/x", "unsupported store URI scheme 'postgres'"),
        ("mongodb://", "malformed MongoDB URI"),
        ("mongodb://127.0.0.1:1/x", r"cannot reach MongoDB at 127\.0\.0\.1:1"),
    ],
    ids=["empty", "scheme", "malformed", "unreachable"],
)
def test_bad_store_settings_fail_fast_with_one_line(uri: str, message: str) -> None:
    started = time.monotonic()
    with pytest.raises(StoreError, match=message) as err:
        open_store(uri)
    assert isinstance(err.value, UserError) and "\n" not in str(err.value)
    assert time.monotonic() - started < 5


def test_missing_embedded_store_is_not_created_for_reading(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match=r"no store at .*nothing has been recorded"):
        open_store(str(tmp_path / "nope"), read_only=True)
    assert not (tmp_path / "nope").exists()
    (tmp_path / "file").write_text("x")
    with pytest.raises(StoreError, match="is a file, not a directory"):
        open_store(f"embedded://{tmp_path / 'file'}")


@pytest.mark.ferretdb
def test_reads_during_an_outage_raise_store_unavailable(ferretdb: object, tmp_path: Path) -> None:
    from tests.fixtures.ferretdb import FerretDBServer

    assert isinstance(ferretdb, FerretDBServer)
    with open_store(ferretdb.uri(), options=StoreOptions(spill_dir=tmp_path)) as store:
        store.record_run(samples.run_info("r1"))
        ferretdb.kill()
        started = time.monotonic()
        with pytest.raises(StoreUnavailable, match="did not answer") as err:
            store.runs()
        assert err.value.retryable and time.monotonic() - started < 5
        store.record_requests(samples.requests("r1", 10))  # buffered, no exception
        assert store.buffer_stats().pending == 10
        ferretdb.start()
        store.flush()
        assert store.buffer_stats().pending == 0
        assert len(list(store.requests("r1"))) == 10


def test_run_totals_round_trip_once_per_run(store: Store) -> None:
    store.record_run(samples.run_info("r1"))
    totals = RunTotals(
        run="r1",
        slots=20,
        balance=LoadBalanceStats(
            slots=20, mean_deviation=0.002, mean_virtual_queue=0.0, high_kv_share=0.05
        ),
        windows=WindowTotals(windows=50, requests=120, fallbacks=1, decision_s_mean=0.001),
    )
    store.record_totals(totals)
    store.record_totals(totals)  # a replay: still one document
    assert store.totals("r1") == totals
    assert store.totals("r2") is None
    assert store.status().counts["run_totals"] == 1


def test_routing_windows_are_told_from_slot_maps(store: Store) -> None:
    store.record_run(samples.run_info("r1"))
    slot_map = samples.decisions("r1", epochs=1, slots=1)
    window = Decision[RoutingMap](
        agent="scheduler",
        policy="cema-request",
        source="rule",
        value=RoutingMap(routes=[]),
        run="r1",
        slot=0,
        node="a",
        trigger=WINDOW_TRIGGER,
        window=WindowAudit(start_s=0.5, end_s=1.5, requests=2, used="router", wait_s=0.01),
    )
    store.record_decisions([*slot_map, window])
    assert store.decisions(run="r1", windows=True, limit=100) == [window]
    rest = store.decisions(run="r1", windows=False, limit=100)
    assert rest == slot_map[::-1] and window not in rest
    assert store.decisions(agent="scheduler", run="r1", windows=None, limit=100)[0] == window
