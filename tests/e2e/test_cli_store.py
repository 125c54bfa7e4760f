"""`lmedge decisions` and `lmedge status`, run as the real CLI on an embedded store."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from lmedge.api import (
    Decision,
    LMPlacement,
    LMRouting,
    MacroPolicy,
    NodeRole,
    Placement,
    RequestRecord,
    Route,
    RouteWeight,
    RoutingMap,
)
from lmedge.api.decisions import WINDOW_TRIGGER, WindowAudit
from lmedge.cli import main
from lmedge.store import RunInfo, open_store

MODELS: dict[str, type[BaseModel]] = {
    "planner": Decision[MacroPolicy],
    "scheduler": Decision[RoutingMap],
    "deployer": Decision[Placement],
}


def _placement(node: str, slot: int) -> Decision[Placement]:
    return Decision[Placement](
        agent="deployer",
        policy="lyapunov",
        source="rule",
        run="r1",
        epoch=slot // 2,
        slot=slot,
        node=node,
        value=Placement(node=node, lms=[LMPlacement(lm="lm1", mode="gpu", cpu_cores=4, vgpus=1)]),
    )


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """r1 (MA): one plan, two routing maps (one replaced), four placements;
    12 requests: lm1 4/4 at 90 s, lm2 2/4 at 180 s, lm3 0/4 (2 timed out, 2 rejected)."""
    path = tmp_path_factory.mktemp("store") / "db"
    with open_store(str(path)) as store:
        store.record_run(
            RunInfo(id="r1", scenario="testbed", policy="MA", seed=1, started=datetime.now(UTC))
        )
        store.record_decision(
            Decision[MacroPolicy](
                agent="planner",
                policy="agentic-planner",
                source="llm",
                run="r1",
                value=MacroPolicy(
                    routing=[LMRouting(lm="lm1", weights=[RouteWeight(node="w1", p=1.0)])],
                    roles=[NodeRole(node="w1", lms=["lm1"])],
                ),
                model="gpt-test",
                tokens_in=900,
            )
        )
        for slot in (0, 1):
            store.record_decision(
                Decision[RoutingMap](
                    agent="scheduler",
                    policy="agentic-router" if slot == 0 else "local",
                    source="llm" if slot == 0 else "fallback",
                    run="r1",
                    slot=slot,
                    outcome="accepted" if slot == 0 else "replaced",
                    validated=slot == 0,
                    violations=[] if slot == 0 else ["routes: no destination for (w2, lm1)"],
                    value=RoutingMap(routes=[Route(origin="w2", lm="lm1", destination="w1")]),
                )
            )
            for node in ("w1", "w2"):
                store.record_decision(_placement(node, slot))
        records = []

        def refused(i: int) -> bool:  # admission control refused half of lm3's requests
            return i >= 8 and i % 2 == 0

        for i in range(12):
            lm = f"lm{i // 4 + 1}"
            ok = lm == "lm1" or (lm == "lm2" and i % 2 == 0)
            latency = 90.0 if lm == "lm1" else 180.0 if ok else 900.0
            records.append(
                RequestRecord(
                    id=f"q{i}",
                    run="r1",
                    lm=lm,
                    origin="w2",
                    destination="w1",
                    prompts=2,
                    slot=i % 3,
                    submit_s=30.0 * (i % 3),
                    queue_s=0.0 if refused(i) else latency,
                    outcome="success" if ok else "rejected" if refused(i) else "timeout",
                )
            )
        store.record_requests(records)
    return path


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    try:
        main(list(args))
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(autouse=True)
def _wide_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.delenv("LMEDGE_STORE", raising=False)


def decisions_json(capsys: pytest.CaptureFixture[str], store: Path, *args: str) -> list[Any]:
    code, out, err = run_cli(capsys, "decisions", "--store", str(store), "--json", *args)
    assert (code, err) == (0, "")
    found: list[Any] = json.loads(out)
    return found


def test_decisions_table_lists_the_latest_first(
    capsys: pytest.CaptureFixture[str], store_dir: Path
) -> None:
    code, out, _ = run_cli(capsys, "decisions", "--store", str(store_dir), "--wide")
    assert code == 0
    assert "7 latest decisions of run r1" in out
    agents = ("planner", "scheduler", "deployer")
    rows = [line for line in out.splitlines() if line.split()[2:3] and line.split()[2] in agents]
    assert len(rows) == 7
    assert "deployer" in rows[0] and "planner" in rows[-1]
    (replaced,) = [row for row in rows if "replaced" in row]
    assert "routes: no destination for (w2, lm1)" in replaced
    assert "lm1:gpu(4c,1v)" in out
    assert "1 routes, 1 to another node" in out


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ((), 7),
        (("--agent", "deployer"), 4),
        (("--agent", "scheduler", "--slot", "1"), 1),
        (("--node", "w2"), 2),
        (("--epoch", "0"), 7),
        (("--run", "r1", "--limit", "3"), 3),
        (("-a", "planner"), 1),
    ],
    ids=["all", "agent", "agent-and-slot", "node", "epoch", "run-and-limit", "short-agent"],
)
def test_decisions_filters(
    capsys: pytest.CaptureFixture[str], store_dir: Path, args: tuple[str, ...], expected: int
) -> None:
    found = decisions_json(capsys, store_dir, *args)
    assert len(found) == expected
    for d in found:
        MODELS[d["agent"]].model_validate(d)
    if "--agent" in args:
        assert {d["agent"] for d in found} == {args[args.index("--agent") + 1]}


def test_decisions_json_round_trips_the_audit_fields(
    capsys: pytest.CaptureFixture[str], store_dir: Path
) -> None:
    (replaced,) = decisions_json(capsys, store_dir, "--agent", "scheduler", "--slot", "1")
    assert replaced["outcome"] == "replaced"
    assert replaced["source"] == "fallback"
    assert replaced["violations"] == ["routes: no destination for (w2, lm1)"]
    (plan,) = decisions_json(capsys, store_dir, "--agent", "planner")
    assert (plan["model"], plan["tokens_in"]) == ("gpt-test", 900)


def test_decisions_tell_routing_windows_from_slot_maps(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "db"
    slot_map = Decision[RoutingMap](
        agent="scheduler",
        policy="local",
        source="rule",
        run="r1",
        slot=0,
        value=RoutingMap(routes=[]),
    )
    window = slot_map.model_copy(
        update={
            "policy": "cema-request",
            "node": "w2",
            "trigger": WINDOW_TRIGGER,
            "window": WindowAudit(start_s=0.5, end_s=1.5, requests=2, used="router", wait_s=0.01),
        }
    )
    with open_store(str(path)) as store:
        store.record_run(
            RunInfo(id="r1", scenario="x", policy="cema", seed=1, started=datetime.now(UTC))
        )
        store.record_decisions([slot_map, window])
    assert [d["trigger"] for d in decisions_json(capsys, path, "--windows")] == [WINDOW_TRIGGER]
    assert [d["policy"] for d in decisions_json(capsys, path, "--no-windows")] == ["local"]
    assert len(decisions_json(capsys, path)) == 2
    code, out, _ = run_cli(capsys, "decisions", "--store", str(path))
    assert code == 0
    rows = [line for line in out.splitlines() if "scheduler" in line]
    assert len(rows) == 2 and sum("scheduler (window)" in row for row in rows) == 1


def test_store_from_the_environment(
    capsys: pytest.CaptureFixture[str], store_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LMEDGE_STORE", str(store_dir))
    code, out, _ = run_cli(capsys, "decisions", "--json", "-n", "1")
    assert code == 0
    assert len(json.loads(out)) == 1


def test_status_json_hand_computed(capsys: pytest.CaptureFixture[str], store_dir: Path) -> None:
    code, out, err = run_cli(capsys, "status", "--store", str(store_dir), "--json")
    assert (code, err) == (0, "")
    report = json.loads(out)
    assert report["run"] == "r1"
    assert report["counts"]["requests"] == 12
    assert report["counts"]["deployments"] == 4
    assert (report["requests"], report["successes"]) == (12, 6)
    assert (report["rejected"], report["rejected_ratio"]) == (2, pytest.approx(2 / 12))
    per_lm = {s["lm"]: (s["success_ratio"], s["mean_latency_s"]) for s in report["per_lm"]}
    assert per_lm == {"lm1": (1.0, 90.0), "lm2": (0.5, 180.0), "lm3": (0.0, None)}
    # rho = (1, .5, 0): F = 2.25 / (3 * 1.25) = 0.6, F_norm = (0.6 - 1/3) / (2/3) = 0.4
    assert report["jain"] == pytest.approx(0.6)
    mean = (4 * 90 + 2 * 180) / 6
    assert report["mean_latency_s"] == pytest.approx(mean)
    assert report["t_norm"] == pytest.approx(mean / 900)
    assert report["objective"] == pytest.approx(0.5 * mean / 900 + 0.5 * 0.6)


def test_status_table(capsys: pytest.CaptureFixture[str], store_dir: Path) -> None:
    code, out, _ = run_cli(capsys, "status", "--store", str(store_dir), "--run", "r1")
    assert code == 0
    assert f"embedded store {store_dir}" in out
    assert "run r1: 12 requests, Jain 0.600" in out
    rows = {
        cells[0]: cells[1:]
        for line in out.splitlines()
        if (cells := [c.strip() for c in line.strip("│ ").split("│")])[0] in ("lm2", "lm3")
    }
    # columns: requests, successes, rejected, success ratio, mean latency
    assert rows == {"lm2": ["4", "2", "0", "0.500", "180.0"], "lm3": ["4", "0", "2", "0.000", "-"]}


@pytest.fixture(scope="module")
def empty_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("empty") / "db"
    open_store(str(path)).close()
    return path


@pytest.mark.parametrize(
    ("command", "store", "extra", "message"),
    [
        ("decisions", "missing", (), "no store at"),
        ("status", "missing", (), "no store at"),
        ("decisions", "ftp://host/x", (), "unsupported store URI scheme 'ftp'"),
        ("status", "embedded://", (), "names no directory"),
        ("decisions", "empty", (), "is empty: no run has been recorded"),
        ("status", "empty", (), "is empty: no run has been recorded"),
        ("decisions", "full", ("--run", "r9"), "no run 'r9'"),
        ("status", "full", ("--run", "r9"), "no run 'r9'"),
        ("decisions", "full", ("--node", "w9"), "no decisions in embedded store"),
    ],
    ids=[
        "decisions-missing-dir",
        "status-missing-dir",
        "bad-scheme",
        "no-directory",
        "decisions-empty",
        "status-empty",
        "decisions-unknown-run",
        "status-unknown-run",
        "nothing-matches",
    ],
)
def test_user_errors_are_one_line(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    store_dir: Path,
    empty_store: Path,
    command: str,
    store: str,
    extra: tuple[str, ...],
    message: str,
) -> None:
    where = {
        "missing": str(tmp_path / "nothing"),
        "empty": str(empty_store),
        "full": str(store_dir),
    }
    code, out, err = run_cli(capsys, command, "--store", where.get(store, store), *extra)
    assert code == 2
    assert out == ""
    assert err.startswith("error: ") and message in err
    assert len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "nothing").exists(), "a read must not create a store"


def test_the_console_script_prints_no_traceback(empty_store: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", "from lmedge.cli import main; main()", "status"],
        env={"LMEDGE_STORE": str(empty_store), "PATH": "/usr/bin:/bin", "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: ")
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
