"""The CLI read in an 80-column terminal: `lmedge decisions`, `lmedge policies`,
`lmedge --version`, and `lmedge dashboard` started as the demo says.

Run as a user would (the in-process runner of `tests/e2e/cli.py`, or a real
process for the dashboard), on an embedded store written through `Store`.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import subprocess
import sys
import time
from importlib.metadata import version
from pathlib import Path

import httpx
import pytest

from lmedge.api import Decision, LMPlacement, Placement, Route, RoutingMap
from lmedge.controller import catalog
from lmedge.store import RunInfo, open_store

from .cli import cli

#: Run ids as lmedge writes them: long, and useless when cut.
RUN_A = "testbed-ma-s1-20261201T123906002389"
RUN_B = "testbed-rr-s2-20261201T124011917733"
VIOLATION = "routes: worker-9 is not a node of this cluster"


@pytest.fixture(autouse=True)
def _narrow_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.delenv("LMEDGE_STORE", raising=False)


def _placement(run: str, slot: int, node: str) -> Decision[Placement]:
    return Decision[Placement](
        agent="deployer",
        policy="agentic",
        source="rule",
        run=run,
        slot=slot,
        node=node,
        value=Placement(node=node, lms=[LMPlacement(lm="lm1", mode="gpu", cpu_cores=2, vgpus=1)]),
    )


def _replaced(run: str, slot: int) -> Decision[RoutingMap]:
    return Decision[RoutingMap](
        agent="scheduler",
        policy="agentic",
        source="llm",
        run=run,
        slot=slot,
        outcome="replaced",
        validated=False,
        violations=[VIOLATION, "routes: lm9 is not an LM of this cluster"],
        tokens_in=1834,
        tokens_out=61,
        raw='{"routes": []}',
        value=RoutingMap(routes=[Route(origin="worker-1", lm="lm1", destination="worker-3")]),
    )


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """RUN_A: four placements and one replaced LLM routing map; RUN_B: two placements."""
    path = tmp_path_factory.mktemp("readable") / "db"
    with open_store(str(path)) as s:
        for run in (RUN_B, RUN_A):  # RUN_A is the newer one
            s.record_run(RunInfo(id=run, scenario="testbed", policy=run.split("-")[1]))
        s.record_decisions([_placement(RUN_B, 0, "worker-1"), _placement(RUN_B, 0, "worker-2")])
        s.record_decisions([_placement(RUN_A, slot, f"worker-{slot}") for slot in (1, 2, 3, 4)])
        s.record_decision(_replaced(RUN_A, 5))
    return path


def test_decisions_fit_80_columns_and_name_the_run_whole(
    capsys: pytest.CaptureFixture[str], store: Path
) -> None:
    code, out, err = cli(["decisions", "--store", str(store), "--run", RUN_A], capsys)
    assert (code, err) == (0, "")
    assert all(len(line.rstrip()) <= 80 for line in out.splitlines()), out
    assert f"of run {RUN_A}" in out  # whole, so it can be pasted into --run
    lines = out.splitlines()
    rows = [i for i, line in enumerate(lines) if line.split()[:1] in (["deployer"], ["scheduler"])]
    assert len(rows) == 5
    # The reason has its own column (wrapped within it): the first violation and how many more.
    (at,) = [i for i in rows if "replaced" in lines[i]]
    start = next(line for line in lines if line.startswith("agent")).index("reason")
    cell = [lines[at][start:].strip()]
    for line in lines[at + 1 :]:
        if line[:start].strip():
            break
        cell.append(line[start:].strip())
    assert " ".join(cell) == f"{VIOLATION} (+1 more)"


def test_the_printed_run_id_pastes_into_run(
    capsys: pytest.CaptureFixture[str], store: Path
) -> None:
    code, out, _ = cli(["decisions", "--store", str(store), "--agent", "scheduler"], capsys)
    assert code == 0
    pasted = re.search(r"of run (\S+)", out)
    assert pasted is not None
    code, again, _ = cli(["decisions", "--store", str(store), "--run", pasted.group(1)], capsys)
    assert code == 0 and "5 latest decisions" in again


def test_several_runs_get_short_keys_or_full_ids(
    capsys: pytest.CaptureFixture[str], store: Path
) -> None:
    code, out, _ = cli(["decisions", "--store", str(store)], capsys)
    assert code == 0
    assert all(len(line.rstrip()) <= 80 for line in out.splitlines()), out
    assert f"[1] {RUN_A}" in out and f"[2] {RUN_B}" in out
    code, out, _ = cli(["decisions", "--store", str(store), "--full-ids"], capsys)
    assert code == 0
    full = [line for line in out.splitlines() if line.startswith((RUN_A, RUN_B))]
    assert len(full) == 7
    assert sum(line.startswith(RUN_B) for line in full) == 2


def test_wide_adds_tokens_every_violation_and_the_value(
    capsys: pytest.CaptureFixture[str], store: Path
) -> None:
    code, out, _ = cli(
        ["decisions", "--store", str(store), "--run", RUN_A, "--agent", "scheduler", "--wide"],
        capsys,
    )
    assert code == 0
    assert "1834/61" in out
    assert VIOLATION in out and "routes: lm9 is not an LM of this cluster" in out
    assert "1 routes, 1 to another node" in out
    assert "(+1 more)" not in out


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("--source", "llm"), 1),
        (("--source", "rule"), 6),
        (("--outcome", "replaced"), 1),
        (("--outcome", "accepted", "--run", RUN_B), 2),
    ],
    ids=["llm", "rule", "replaced", "accepted-of-run"],
)
def test_source_and_outcome_filters(
    capsys: pytest.CaptureFixture[str], store: Path, args: tuple[str, ...], expected: int
) -> None:
    code, out, err = cli(["decisions", "--store", str(store), "--json", *args], capsys)
    assert (code, err) == (0, "")
    found = json.loads(out)
    assert len(found) == expected
    if "--source" in args:
        assert {d["source"] for d in found} == {args[1]}


def test_a_bad_source_is_one_line(capsys: pytest.CaptureFixture[str], store: Path) -> None:
    code, _, err = cli(["decisions", "--store", str(store), "--source", "oracle"], capsys)
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and "--source" in err


def test_version_is_the_installed_distributions(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = cli(["--version"], capsys)
    assert code == 0
    assert out.strip() == f"lmedge {version('lmedge')}"


def test_policies_lists_every_profile_and_plugin_on_one_line_each(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = cli(["policies"], capsys)
    assert code == 0
    lines = out.splitlines()
    assert all(len(line) <= 80 for line in lines), [x for x in lines if len(x) > 80]
    for p in catalog.PROFILES.values():
        (line,) = [x for x in lines if x.split()[:1] == [p.name] and "/" in x]
        assert f"{p.planner}/{p.router}/{p.deployer}" in line
    for table in (catalog.PLANNERS, catalog.ROUTERS, catalog.DEPLOYERS):
        for name, entry in table.items():
            assert any(x.split()[:1] == [name] and entry.summary[:20] in x for x in lines), name


def test_policies_json_has_the_full_summaries(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = cli(["policies", "--json"], capsys)
    assert code == 0
    listing = json.loads(out)
    assert {p["name"]: p["summary"] for p in listing["profiles"]} == {
        name: p.summary for name, p in catalog.PROFILES.items()
    }
    assert {e["name"] for e in listing["routers"]} == set(catalog.ROUTERS)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--host", "0.0.0.0"], "--host 0.0.0.0 is not a loopback address: give --token-file"),
        (["--token-file", "/nonexistent/token"], "--token-file /nonexistent/token"),
        (["--port", "0"], "--port must be between 1 and 65535"),
    ],
    ids=["open-on-all-interfaces", "missing-token-file", "bad-port"],
)
def test_dashboard_refuses_bad_options_in_one_line(
    capsys: pytest.CaptureFixture[str], store: Path, args: list[str], message: str
) -> None:
    code, _, err = cli(["dashboard", "--store", str(store), *args], capsys)
    assert code == 2
    assert message in err and len(err.strip().splitlines()) == 1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_the_dashboard_command_the_demo_prints_shows_the_demo_run(tmp_path: Path) -> None:
    """`lmedge demo`, then the command its last line gives: the demo run is on the page."""
    env = {**os.environ, "COLUMNS": "200"}
    env.pop("LMEDGE_STORE", None)
    runner = [sys.executable, "-c", "from lmedge.cli import main; main()"]
    demo = subprocess.run(
        [*runner, "demo", "--slots", "10"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert demo.returncode == 0, demo.stderr
    run = re.search(r"\(run (\S+)\)", demo.stdout)
    command = re.search(r"see it in a browser: (.+?) \(then open", demo.stdout)
    assert run and command
    args = shlex.split(command.group(1))
    assert args[:2] in (["lmedge", "dashboard"], [args[0], "dashboard"])
    port = _free_port()
    log = tmp_path / "dashboard.log"
    with log.open("w") as sink:
        server = subprocess.Popen(
            [*runner, *args[1:], "--port", str(port)],
            cwd=tmp_path,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 60
        page = None
        while time.monotonic() < deadline and server.poll() is None:
            try:
                page = httpx.get(f"http://127.0.0.1:{port}/", timeout=5)
                break
            except httpx.HTTPError:
                time.sleep(0.3)
        assert page is not None, log.read_text()
        assert page.status_code == 200 and run.group(1) in page.text
        reports = httpx.get(f"http://127.0.0.1:{port}/reports", timeout=10)
        assert 'data-report="reports/demo"' in reports.text
    finally:
        server.terminate()
        server.wait(timeout=10)
