"""Store benchmarks (run by `make bench`): write and query rates per backend.

Measures, on the embedded store (MontyDB/SQLite) and on FerretDB v1/SQLite:
bulk request records (20,000 in batches of 500), single decision inserts (500),
and queries (latest decisions, per-LM aggregates, a full request scan of the
run). Results are printed and written to reports/bench-store.json.
"""

from __future__ import annotations

import importlib.util
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from lmedge.api.decisions import Decision, Placement
from lmedge.api.records import RequestRecord
from lmedge.errors import StoreUnavailable
from lmedge.store import RunInfo, Store, StoreOptions, open_store

pytestmark = pytest.mark.bench

ROOT = Path(__file__).resolve().parents[1]
RECORDS = 20_000
BATCH = 500
DECISIONS = 500
RESULTS: dict[str, Any] = {}


def _ferretdb_module() -> Any:
    # benchmarks/ is not a package; load the test fixture's server class by path.
    path = ROOT / "tests" / "fixtures" / "ferretdb.py"
    spec = importlib.util.spec_from_file_location("_lmedge_bench_ferretdb", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(params=["embedded", "ferretdb"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, Store]]:
    options = StoreOptions(spill_dir=tmp_path / "spill", batch_size=BATCH)
    if request.param == "embedded":
        with open_store(f"embedded://{tmp_path / 'store'}", options=options) as s:
            yield "embedded", s
        return
    fdb = _ferretdb_module()
    binary = fdb.ferretdb_binary()
    if not binary.is_file():
        pytest.skip(f"FerretDB binary not found at {binary}; build it with `make tools`")
    server = fdb.FerretDBServer(binary, tmp_path / "ferretdb-data")
    server.start()
    try:
        with open_store(server.uri("bench"), options=options) as s:
            yield "ferretdb", s
    finally:
        server.stop()


def _records(n: int) -> list[RequestRecord]:
    return [
        RequestRecord(
            id=f"bench-{i:07d}", run="bench", lm=f"lm{i % 12}", origin=f"n{i % 7}",
            destination=f"n{(i + 3) % 7}", prompts=5, prompts_done=5, slot=i // 100,
            submit_s=i * 0.05, uplink_s=0.1, queue_s=0.2, inference_s=1.5, downlink_s=0.05,
            outcome="success" if i % 10 else "timeout", mode="gpu",
        )
        for i in range(n)
    ]


def _decision(i: int) -> Decision[Placement]:
    value = Placement.model_validate(
        {"node": f"n{i % 7}", "lms": [{"lm": f"lm{k}", "mode": "gpu", "cpu_cores": 2.0,
                                       "vgpus": 1} for k in range(4)]}
    )
    return Decision[Placement](agent="deployer", policy="bench", source="rule", value=value,
                               run="bench", epoch=i // 70, slot=i // 7, node=f"n{i % 7}")


def _rate(n: int, action: Callable[[], Any]) -> tuple[float, float]:
    start = time.perf_counter()
    action()
    elapsed = time.perf_counter() - start
    return elapsed, n / elapsed


def test_store_write_and_query_rates(store: tuple[str, Store]) -> None:
    name, s = store
    s.record_run(RunInfo(id="bench", scenario="bench", policy="MA", seed=1))
    records = _records(RECORDS)
    decisions = [_decision(i) for i in range(DECISIONS)]

    def bulk() -> None:
        for k in range(0, RECORDS, BATCH):
            s.record_requests(records[k : k + BATCH])

    def singles() -> None:
        for d in decisions:
            s.record_decision(d)

    queries = 20
    out: dict[str, float] = {}
    out["bulk_s"], out["bulk_records_per_s"] = _rate(RECORDS, bulk)
    out["single_s"], out["single_decisions_per_s"] = _rate(DECISIONS, singles)
    out["latest_s"], out["latest_decision_queries_per_s"] = _rate(
        queries, lambda: [s.decisions(agent="deployer", run="bench", node="n3", limit=20)
                          for _ in range(queries)]
    )
    stats: list[Any] = []
    out["lm_stats_s"], out["lm_stats_queries_per_s"] = _rate(
        3, lambda: stats.extend(s.lm_stats("bench") for _ in range(3))
    )
    scanned: list[RequestRecord] = []
    out["scan_s"], out["scan_records_per_s"] = _rate(
        RECORDS, lambda: scanned.extend(s.requests("bench"))
    )
    assert len(scanned) == RECORDS and sum(x.arrivals for x in stats[0]) == RECORDS
    assert s.buffer_stats().pending == 0

    RESULTS[name] = {k: round(v, 3) for k, v in out.items()}
    print(f"\n[store bench] {name}: " + ", ".join(f"{k}={v:,.1f}" for k, v in out.items()))
    report = ROOT / "reports" / "bench-store.json"
    report.parent.mkdir(exist_ok=True)
    report.write_text(json.dumps(RESULTS, indent=2) + "\n")


# -- a run on a store that already holds many runs ---------------------------------

EARLIER_RUNS = 50
RUN_SLOTS = 200
#: `make bench` target: a run on a store holding EARLIER_RUNS runs takes at most
#: this many times as long as the same run on a fresh store.
POPULATED_RATIO_MAX = 1.2


def _timed_run(store: Store) -> tuple[float, str]:
    from lmedge.bench.runner import RunSpec, resolve_scenario, run
    from lmedge.controller.assembly import PolicyChoice

    spec = RunSpec(resolve_scenario("testbed"), PolicyChoice("ma"), 1, RUN_SLOTS)
    start = time.perf_counter()
    outcome = run(spec, store=store)
    return time.perf_counter() - start, outcome.run_id


def _copy_run(source: Store, run_id: str, target: Store, copies: int) -> int:
    """Store `copies` copies of run `run_id` under new run ids; documents written.

    The copies keep the run's request ids, as a second run with the same seed
    does (the case that once made every insert fall back to a full scan).
    """
    [info] = [r for r in source.runs(limit=1000) if r.id == run_id]
    records = list(source.requests(run_id))
    decisions = source.decisions(run=run_id, limit=1_000_000)
    telemetry = source.telemetry(run=run_id, limit=1_000_000)
    memory = source.memory_cases(run=run_id, limit=1_000)
    written = 0
    for k in range(copies):
        new = f"{run_id}-copy{k:02d}"
        target.record_run(info.model_copy(update={"id": new}))
        target.record_requests(r.model_copy(update={"run": new}) for r in records)
        target.record_decisions(d.model_copy(update={"run": new}) for d in decisions)
        target.record_telemetry(t.model_copy(update={"run": new}) for t in telemetry)
        for case in memory:
            target.record_memory(case.model_copy(update={"run": new}))
        written += 1 + len(records) + len(decisions) + len(telemetry) + len(memory)
    target.flush()
    return written


def test_a_run_on_a_store_holding_50_runs_is_as_fast_as_on_a_fresh_store(
    tmp_path: Path,
) -> None:
    """The embedded store's cost per run must not grow with the runs it holds
    (issue 14 item 7: a 200-slot run took 1.7 s fresh, 183 s after 50 runs)."""
    options = StoreOptions(spill_dir=tmp_path / "spill", batch_size=BATCH)
    fresh: list[float] = []
    ids: list[str] = []
    for k in range(2):  # the faster of two, on a loaded machine
        with open_store(f"embedded://{tmp_path / f'fresh{k}'}", options=options) as s:
            elapsed, run_id = _timed_run(s)
            fresh.append(elapsed)
            ids.append(run_id)
            assert s.buffer_stats().lost == 0
    with (
        open_store(f"embedded://{tmp_path / 'fresh0'}", options=options) as source,
        open_store(f"embedded://{tmp_path / 'populated'}", options=options) as s,
    ):
        start = time.perf_counter()
        documents = _copy_run(source, ids[0], s, EARLIER_RUNS)
        setup_s = time.perf_counter() - start
        populated = []
        for _ in range(2):
            elapsed, new_id = _timed_run(s)
            populated.append(elapsed)
            assert s.buffer_stats().lost == 0
            assert s.lm_stats(new_id), "the new run's records are all there"
        held = s.status().counts
    ratio = min(populated) / min(fresh)
    out = {
        "earlier_runs": EARLIER_RUNS,
        "documents_held": sum(held.values()),
        "setup_s": round(setup_s, 2),
        "fresh_run_s": round(min(fresh), 3),
        "populated_run_s": round(min(populated), 3),
        "ratio": round(ratio, 3),
        "target_ratio": POPULATED_RATIO_MAX,
    }
    RESULTS["populated_store"] = out
    print(
        f"\n[store bench] {RUN_SLOTS}-slot testbed run (ma): fresh store {min(fresh):.2f} s, "
        f"store holding {EARLIER_RUNS} runs ({documents:,} documents) {min(populated):.2f} s, "
        f"ratio {ratio:.2f} (target <= {POPULATED_RATIO_MAX})"
    )
    report = ROOT / "reports" / "bench-store.json"
    report.parent.mkdir(exist_ok=True)
    report.write_text(json.dumps(RESULTS, indent=2) + "\n")
    assert ratio <= POPULATED_RATIO_MAX


# -- the controller's slot path on a store holding 100,000 records ------------------

HELD_RECORDS = 100_000
SLOT_RECORDS = 500
SLOTS = 10
#: `make bench` targets (issue 30): the slot's record read, and what the slot's
#: writes cost the controller before its next routing push, both at P95.
READ_MS_MAX = 50.0
WRITE_MS_MAX = 10.0


def _p95(values: list[float]) -> float:
    return sorted(values)[max(0, int(0.95 * len(values)) - 1)] if values else 0.0


def test_controller_slot_path_on_ferretdb_holding_100k_records(tmp_path: Path) -> None:
    """The controller reads a slot's gateway records from the feed and hands
    the slot's writes (and the feed's removal of what it read) to the
    background flush, on FerretDB holding 100,000 request records of the run.
    For contrast, one read of the same slot by a `_seq` range on the records
    (the former design) is timed too."""
    from lmedge.store import RecordCursor

    fdb = _ferretdb_module()
    binary = fdb.ferretdb_binary()
    if not binary.is_file():
        pytest.skip(f"FerretDB binary not found at {binary}; build it with `make tools`")
    server = fdb.FerretDBServer(binary, tmp_path / "ferretdb-data")
    server.start()
    gateway_options = StoreOptions(spill_dir=tmp_path / "spill-gw", batch_size=BATCH)
    controller_options = StoreOptions(
        spill_dir=tmp_path / "spill-ctl", batch_size=BATCH, background_flush=True
    )
    records = _records(HELD_RECORDS + SLOTS * SLOT_RECORDS)
    try:
        with (
            open_store(server.uri("bench"), options=gateway_options) as gateway,
            open_store(server.uri("bench"), options=controller_options) as controller,
        ):
            gateway.record_run(RunInfo(id="bench", scenario="bench", policy="MA", seed=1))
            start = time.perf_counter()
            for k in range(0, HELD_RECORDS, BATCH):
                gateway.record_requests(records[k : k + BATCH])
            fill_s = time.perf_counter() - start
            cursor = RecordCursor("bench")
            reads: list[float] = []
            writes: list[float] = []
            got = 0
            for slot in range(SLOTS):
                first = HELD_RECORDS + slot * SLOT_RECORDS
                gateway.record_requests(records[first : first + SLOT_RECORDS], feed=True)
                start = time.perf_counter()
                fresh = controller.requests_after(cursor)
                reads.append((time.perf_counter() - start) * 1000)
                got += len(fresh)
                decisions = [_decision(i) for i in range(7)]
                start = time.perf_counter()
                controller.record_decisions(decisions)  # its records: the gateway stored them
                writes.append((time.perf_counter() - start) * 1000)
            controller.flush()
            # not counted on the server: a count of 100,000 records exceeds 30 s on FerretDB
            held = HELD_RECORDS + got
            lost = controller.buffer_stats().lost + gateway.buffer_stats().lost
            print(f"\n[store bench] feed reads ms {[round(r, 1) for r in reads]}, "
                  f"slot writes ms {[round(w, 2) for w in writes]}")  # fmt: skip
            start = time.perf_counter()
            try:  # FerretDB scans the 100,000 records: may exceed the 30-s socket timeout
                scanned = len(
                    list(
                        controller._backend.find(
                            "requests", {"run": "bench", "_seq": {"$gt": 0}},
                            sort=[("_seq", -1)], limit=SLOT_RECORDS,
                        )
                    )
                )  # fmt: skip
            except StoreUnavailable:
                scanned = -1
            range_ms = (time.perf_counter() - start) * 1000
    finally:
        server.stop()
    assert got == SLOTS * SLOT_RECORDS and scanned in (SLOT_RECORDS, -1) and lost == 0
    out = {
        "records_held": held,
        "fill_s": round(fill_s, 1),
        "slot_records": SLOT_RECORDS,
        "feed_read_ms_p95": round(_p95(reads), 1),
        "feed_read_ms_max": round(max(reads), 1),
        "slot_writes_ms_p95": round(_p95(writes), 2),
        "range_read_ms": round(range_ms, 1),
        "range_read_timed_out": scanned < 0,
        "targets_ms": {"read": READ_MS_MAX, "writes": WRITE_MS_MAX},
    }
    RESULTS["controller_slot_path"] = out
    print(
        f"\n[store bench] FerretDB holding {held:,} records: feed read of {SLOT_RECORDS} "
        f"records p95 {out['feed_read_ms_p95']} ms (target <= {READ_MS_MAX}), slot writes "
        f"p95 {out['slot_writes_ms_p95']} ms (target <= {WRITE_MS_MAX}); the former "
        f"_seq-range read {range_ms:.0f} ms{' (timed out)' if scanned < 0 else ''}"
    )
    report = ROOT / "reports" / "bench-store.json"
    report.parent.mkdir(exist_ok=True)
    report.write_text(json.dumps(RESULTS, indent=2) + "\n")
    # The read target is printed, not asserted: the read costs a find of a
    # slot's few feed documents (one per gateway write, their records opaque to
    # the server) and the records' validation, not anything per record held;
    # 15-40 ms on a loaded 2-core machine, where another process can take the
    # CPU for longer than the target. The writes, the removal of what was read
    # among them, are asserted.
    assert _p95(writes) <= WRITE_MS_MAX
