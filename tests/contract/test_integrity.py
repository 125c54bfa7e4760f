"""No record lost, duplicated or misplaced, on the embedded store and on FerretDB.

Each test names the defect it guards against: runs overwriting each other,
a different record taken for a replay, one bad document failing its batch,
spill files replayed into the wrong database, a failed spill reported as a
spill, a run that fails although its store came back, and a bogus LLM reply
that kills the control loop.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pymongo
import pytest

from lmedge.backends.emulated.backend import EmulatedBackend
from lmedge.cli import main
from lmedge.controller.assembly import PolicyChoice, build_plugins
from lmedge.controller.loop import ControlLoop
from lmedge.sim.scenario import load_scenario
from lmedge.store import StoreOptions, open_store
from lmedge.store.documents import DECISION_COLLECTIONS
from tests.fixtures.ferretdb import FerretDBServer
from tests.fixtures.llm_server import LLMServer

from . import samples

ROOT = Path(__file__).resolve().parents[2]
TESTBED = ROOT / "examples" / "testbed"


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    """Run `lmedge ARGS --json` in this process; its JSON output."""
    main([*args, "--json"])
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    return out


def test_two_runs_with_the_same_seed_each_keep_all_their_records(
    store_uri_param: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:  # fmt: skip
    """Item 6: the emulator's request ids repeat with the seed; the second run's
    records were dropped as duplicates of the first's (0 requests in status)."""
    monkeypatch.chdir(tmp_path)  # the default spill folder lands here
    args = ("simulate", "-p", "rr", "--slots", "6", "--seed", "3", "--no-settle", "--timings")
    runs = [_cli(capsys, *args, "--store", store_uri_param) for _ in range(2)]
    ids = [r["timing"]["run_id"] for r in runs]
    assert ids[0] != ids[1] and runs[0]["requests"] == runs[1]["requests"] > 0
    for summary, run_id in zip(runs, ids, strict=True):
        status = _cli(capsys, "status", "--run", run_id, "--store", store_uri_param)
        assert status["run"] == run_id
        got = {x["lm"]: x["arrivals"] for x in status["per_lm"]}
        assert got == {x["lm"]: x["arrivals"] for x in summary["per_lm"]}
        assert sum(got.values()) == summary["requests"]
    with open_store(store_uri_param, read_only=True) as store:
        assert store.status().counts["requests"] == 2 * runs[0]["requests"]


def test_a_different_record_under_a_taken_id_is_reported_not_dropped(
    store_uri_param: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A collision with other content is a counted, logged error; a replay is not."""
    options = StoreOptions(spill_dir=tmp_path / "spill")
    with open_store(store_uri_param, options=options) as store:
        store.record_run(samples.run_info("r1"))
        first = samples.requests("r1", 5)
        store.record_requests(first)
        other = first[2].model_copy(update={"prompts": 99, "outcome": "timeout"})
        fresh = samples.requests("r1", 2, start=100)
        with caplog.at_level(logging.ERROR, logger="lmedge.store"):
            store.record_requests([fresh[0], other, fresh[1]])
            store.record_requests(first)  # a replay: same content, nothing to report
        stats = store.buffer_stats()
        stored = {r.id: r for r in store.requests("r1")}
    assert (stats.conflicts, stats.refused, stats.lost) == (1, 0, 1)
    assert "r1-q000002" in caplog.text and "different content" in caplog.text
    assert len(stored) == 7 and stored["r1-q000002"] == first[2]  # the first stays
    assert stored["r1-q000100"] == fresh[0] and stored["r1-q000101"] == fresh[1]


def test_a_document_that_cannot_be_encoded_loses_only_itself(
    store_uri_param: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Item 13's store half: one integer beyond 64 bits failed (and raised from)
    its whole batch; now it alone is refused and reported."""
    options = StoreOptions(spill_dir=tmp_path / "spill")
    with open_store(store_uri_param, options=options) as store:
        store.record_run(samples.run_info("r1"))
        batch = samples.requests("r1", 5)
        batch[2] = batch[2].model_copy(update={"prompts": 2**64 + 1})
        with caplog.at_level(logging.ERROR, logger="lmedge.store"):
            store.record_requests(batch)  # must not raise
        stats = store.buffer_stats()
        stored = sorted(r.id for r in store.requests("r1"))
    assert (stats.refused, stats.lost, stats.pending) == (1, 1, 0)
    assert stored == sorted(r.id for i, r in enumerate(batch) if i != 2)
    assert "r1-q000002" in caplog.text and "cannot be encoded" in caplog.text


@pytest.mark.ferretdb
def test_a_spill_is_replayed_only_into_its_own_database(
    ferretdb: FerretDBServer, tmp_path: Path
) -> None:
    """Item 9: spill files were keyed by the server only, so a run against
    database B replayed what a run against database A had spilled."""
    options = StoreOptions(spill_dir=tmp_path / "spill", retry_interval_s=0.1, drain_s=0.3)
    with open_store(ferretdb.uri("dba"), options=options) as a:
        a.record_run(samples.run_info("ra"))
        ferretdb.kill()
        a.record_requests(samples.requests("ra", 20))  # buffered; spilled at close
    assert list((tmp_path / "spill").glob("*.jsonl"))
    ferretdb.start()
    with open_store(ferretdb.uri("dbb"), options=options) as b:
        b.record_run(samples.run_info("rb"))
        b.record_requests(samples.requests("rb", 3))
        b.flush()
        assert b.status().counts["requests"] == 3
        assert {r.run for r in b.requests("rb")} == {"rb"}
    assert list((tmp_path / "spill").glob("*.jsonl")), "A's spill file is left for A"
    with open_store(ferretdb.uri("dba"), options=options) as a:
        a.flush()
        assert len(list(a.requests("ra"))) == 20
    assert not list((tmp_path / "spill").glob("*.jsonl"))
    with pymongo.MongoClient(ferretdb.uri()) as client:
        assert client["dbb"]["requests"].count_documents({"run": "ra"}) == 0


@pytest.mark.ferretdb
def test_a_failed_spill_is_counted_and_logged_as_a_loss(
    ferretdb: FerretDBServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Item 10: with an unwritable spill folder the documents were dropped and
    the log said they were spilled."""
    blocker = tmp_path / "read-only-root"
    blocker.write_text("")  # the spill folder cannot be created under a file
    options = StoreOptions(spill_dir=blocker / "spill", retry_interval_s=0.1, drain_s=0.3)
    with caplog.at_level(logging.WARNING, logger="lmedge.store"):
        store = open_store(ferretdb.uri(), options=options)
        store.record_run(samples.run_info("r1"))
        ferretdb.kill()
        store.record_requests(samples.requests("r1", 12))
        store.close()
    stats = store.buffer_stats()
    assert (stats.dropped, stats.lost, stats.spilled) == (12, 12, 0)
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert any("12 documents LOST" in m for m in errors)
    assert any("12 documents were not stored" in m for m in errors)
    assert "spilled to" not in caplog.text


@pytest.mark.ferretdb
@pytest.mark.slow
def test_a_run_whose_store_comes_back_stores_everything_and_exits_0(
    ferretdb: FerretDBServer, tmp_path: Path
) -> None:
    """Item 11: FerretDB stopped mid-run and restarted before the run ends (the
    final write waits for it); the run printed no summary and exited 1, with
    most records in a spill file."""
    code = "import sys; from lmedge.cli import main; main(sys.argv[1:])"
    args = [sys.executable, "-c", code, "simulate", "-p", "rr", "--slots", "60", "--seed", "2",
            "--no-settle", "--json", "--timings", "--store", ferretdb.uri()]  # fmt: skip
    proc = subprocess.Popen(
        args, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    try:
        with pymongo.MongoClient(ferretdb.uri(), serverSelectionTimeoutMS=500) as client:
            deadline = time.monotonic() + 120
            while client.lmedge.requests.estimated_document_count() == 0:
                assert proc.poll() is None and time.monotonic() < deadline, "no records arrive"
                time.sleep(0.05)
        ferretdb.kill()  # mid-run: records are being written
        time.sleep(6.0)  # long enough for the loop to end while the store is away
        ferretdb.start()
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    summary = json.loads(out)
    run_id = summary["timing"]["run_id"]
    with open_store(ferretdb.uri(), read_only=True) as store:
        stored = list(store.requests(run_id))
    assert len(stored) == summary["requests"] > 0
    assert len({r.id for r in stored}) == len(stored)
    assert not list((tmp_path / ".lmedge" / "spill").glob("*.jsonl"))


@pytest.mark.ferretdb
def test_a_huge_usage_number_neither_kills_the_loop_nor_doubles_a_decision(
    llm_server: LLMServer, ferretdb_uri: str, tmp_path: Path
) -> None:
    """Item 13: usage.prompt_tokens > 2^63 could not be encoded in BSON; the batch
    was dropped, the loop died, and close() stored the rest again under new ids."""
    llm_server.default = "huge_prompt_tokens"
    backend = EmulatedBackend(load_scenario(TESTBED, loop={"epoch_slots": 4}), seed=1)
    ctx = backend.context()
    params = {"llm_base_url": llm_server.base_url, "llm_timeout_s": 10.0,
              "llm_budget_s": 20.0, "llm_max_retries": 1}  # fmt: skip
    choice = PolicyChoice(
        profile="ma", params={"planner": params, "router": params, "deployer": params}
    )
    options = StoreOptions(spill_dir=tmp_path / "spill")
    with open_store(ferretdb_uri, options=options) as store:
        loop = ControlLoop(
            backend, build_plugins(choice, ctx, 1), run_id="huge", seed=1, store=store
        )
        result = loop.run(4)
        store.flush()
        stats = store.buffer_stats()
        stored = store.decisions(run="huge", limit=10_000)
    assert result.slots == 4 and stats.lost == 0
    assert any(d.source == "llm" for d in result.decisions)
    keys = sorted((d.agent, d.slot, d.node or "") for d in stored)
    assert keys == sorted((d.agent, d.slot, d.node or "") for d in result.decisions)
    assert len(set(keys)) == len(keys)  # each decision exactly once
    assert all(0 <= d.tokens_in < 2**63 and 0 <= d.tokens_out < 2**63 for d in stored)
    with pymongo.MongoClient(ferretdb_uri) as client:
        db = client.get_default_database()
        total = sum(db[c].count_documents({"run": "huge"}) for c in DECISION_COLLECTIONS.values())
    assert total == len(result.decisions)


def test_the_gateway_record_writer_outlives_a_record_it_cannot_store(
    store_uri_param: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The gateway's writer thread died on the first record the store raised on,
    and every later record of that gateway was silently lost."""
    from lmedge.api.records import RequestRecord
    from lmedge.dataplane.records import StoreSink

    good = samples.requests("r1", 3)
    broken = RequestRecord.model_construct(
        **{**good[0].model_dump(), "id": "bad", "slot": object()}
    )
    store = open_store(store_uri_param, options=StoreOptions(spill_dir=tmp_path / "spill"))
    store.record_run(samples.run_info("r1"))
    sink = StoreSink(store, batch=1, retry_s=0.05)
    with caplog.at_level(logging.ERROR, logger="lmedge.dataplane.records"):
        sink.put(good[0])
        sink.put(broken)
        sink.put(good[1])
        sink.put(good[2])
        sink.close()
    assert (sink.accepted, sink.written, sink.failed) == (4, 3, 1)
    assert "not handed to the store" in caplog.text
    with open_store(store_uri_param, read_only=True) as check:
        assert sorted(r.id for r in check.requests("r1")) == sorted(r.id for r in good)


def test_a_document_another_version_wrote_is_skipped_by_reads_not_fatal(
    store_uri_param: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """One stored document that does not validate (another lmedge version, an
    edit in mongosh) made every read of its collection raise."""
    with open_store(store_uri_param, options=StoreOptions(spill_dir=tmp_path / "spill")) as store:
        store.record_run(samples.run_info("r1"))
        good = samples.requests("r1", 4)
        store.record_requests(good)
        store.record_decisions(samples.decisions("r1", epochs=1, slots=1))
        backend = store._backend  # below the repository: write what it would refuse
        backend.insert("requests", [{"_id": "bad-r", "run": "r1", "lm": 7, "submit_s": 1.0}])
        backend.insert(
            "macro_policies", [{"_id": "bad-d", "_seq": 2**62, "run": "r1", "value": "?"}]
        )
        with caplog.at_level(logging.ERROR, logger="lmedge.store"):
            records = list(store.requests("r1"))
            decisions = store.decisions(run="r1", limit=100)
    assert [r.id for r in records] == [r.id for r in good]
    assert len(decisions) == len(samples.decisions("r1", epochs=1, slots=1))
    assert "'bad-r' in requests skipped" in caplog.text
    assert "'bad-d' in macro_policies skipped" in caplog.text
