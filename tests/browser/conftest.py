"""Fixtures of the browser tier: a store filled by a real simulation, a real
`lmedge dashboard` process over it, and Debian's chromium driven headless by
Playwright (never a downloaded browser: `tools/install-chromium.sh`).

Without chromium the tier skips with the reason; with `LMEDGE_REQUIRE_TOOLS=1`
(CI) that is a failure. Screenshots land in `reports/screenshots/`
(git-ignored), one per view, for a person to look at after a run.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from lmedge.api import Decision, Route, RoutingMap
from lmedge.cli import main
from lmedge.store import open_store

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = ROOT / "reports" / "screenshots"
#: Slots of the simulations the pages show: short, but two epochs (50 slots
#: each) so the macro policy has a history.
SLOTS = 60


def chromium_path() -> Path | None:
    """The system chromium: $LMEDGE_CHROMIUM, else `chromium` on the PATH."""
    for candidate in (os.environ.get("LMEDGE_CHROMIUM"), "chromium", "chromium-browser"):
        if candidate and (found := shutil.which(candidate)):
            return Path(found)
    return None


def _require_chromium() -> Path:
    path = chromium_path()
    if path is None:
        reason = "chromium not found; install it with `bash tools/install-chromium.sh`"
        if os.environ.get("LMEDGE_REQUIRE_TOOLS", "") not in ("", "0", "false"):
            pytest.fail(reason)
        pytest.skip(reason)
    return path


def run_cli(args: list[str]) -> str:
    """`lmedge ARGS` in-process; its stdout. Fails the test on a non-zero exit."""
    import contextlib
    import io

    out = io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out):
        try:
            main(args)
        except SystemExit as exc:
            code = int(exc.code or 0)
    assert code == 0, f"lmedge {' '.join(args)} exited {code}: {out.getvalue()[-2000:]}"
    return out.getvalue()


@dataclass(frozen=True)
class FilledStore:
    """A store holding one simulated run plus an LLM decision that was replaced."""

    path: Path
    run: str
    summary: dict[str, Any]
    #: The scheduler decision (slot `replaced_slot`) whose LLM reply was refused.
    replaced_slot: int
    violations: tuple[str, ...]
    raw: str


@pytest.fixture(scope="session")
def filled_store(tmp_path_factory: pytest.TempPathFactory) -> FilledStore:
    """`lmedge simulate --store` of the testbed under MA, then one audited LLM decision.

    The rule-based agents never produce violations, so the test records what
    an LLM scheduler's refused reply looks like in the store (the controller
    writes exactly this envelope when it replaces a reply).
    """
    path = tmp_path_factory.mktemp("dashboard-store") / "db"
    out = run_cli(
        [
            "simulate",
            "--slots",
            str(SLOTS),
            "--seed",
            "3",
            "--store",
            str(path),
            "--json",
            "--timings",
        ]
    )
    summary = json.loads(out)
    run = summary["timing"]["run_id"]
    violations = (
        "routes: lm9 is not an LM of this cluster",
        "routes: worker-9 is not a node of this cluster",
    )
    raw = '{"routes": [{"origin": "worker-1", "lm": "lm9", "destination": "worker-9"}]}'
    slot = SLOTS - 1
    with open_store(str(path)) as store:
        store.record_decision(
            Decision[RoutingMap](
                agent="scheduler",
                policy="agentic",
                source="llm",
                run=run,
                epoch=slot // 50,
                slot=slot,
                value=RoutingMap(
                    routes=[Route(origin="worker-1", lm="lm1", destination="worker-3")]
                ),
                raw=raw,
                raw_chars=len(raw),
                validated=False,
                outcome="replaced",
                violations=list(violations),
                latency_s=2.5,
                tokens_in=1834,
                tokens_out=61,
                model="qwen2.5-0.5b-instruct",
                sim_time_s=slot * 30.0,
            )
        )
    return FilledStore(path, run, summary, slot, violations, raw)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Dashboard:
    """A `lmedge dashboard` process on 127.0.0.1 (a real server, as a user starts it)."""

    def __init__(self, store: Path, *extra: str, reports: Path | None = None) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        args = ["dashboard", "--store", str(store), "--port", str(self.port), "--refresh", "1"]
        if reports is not None:
            args += ["--reports", str(reports)]
        self._log = open(store.parent / f"dashboard-{self.port}.log", "w+")  # noqa: SIM115
        self._proc = subprocess.Popen(
            [sys.executable, "-c", "from lmedge.cli import main; main()", *args, *extra],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=store.parent,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                self._log.seek(0)
                raise RuntimeError(f"dashboard exited {self._proc.returncode}: {self._log.read()}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError("dashboard did not answer /healthz within 60 s")

    def stop(self) -> None:
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._log.close()


@pytest.fixture(scope="session")
def reports_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two report folders written by `lmedge bench` (MA and RR on the testbed)."""
    root = tmp_path_factory.mktemp("reports")
    for policy in ("ma", "rr"):
        run_cli(
            [
                "bench",
                "--policies",
                policy,
                "--slots",
                "20",
                "--seeds",
                "1",
                "--out",
                str(root / f"bench-{policy}"),
            ]
        )
    return root


@pytest.fixture(scope="session")
def dashboard(filled_store: FilledStore, reports_root: Path) -> Iterator[Dashboard]:
    # A run counts as live for one second after its last decision only, so the
    # pages of the finished simulation do not reload under the test's hands.
    server = Dashboard(filled_store.path, "--live-window", "1", reports=reports_root)
    yield server
    server.stop()


@pytest.fixture(scope="package")
def browser() -> Iterator[Any]:
    """Headless chromium (the system's), shared by the browser tests.

    Package scope, not session: Playwright's sync API keeps an asyncio loop
    running in the main thread while it is open, and every later test calling
    `asyncio.run` (the gateways, the node agents) would fail under it.
    """
    executable = _require_chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=str(executable), headless=True)
        yield b
        b.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    p = context.new_page()
    p.set_default_timeout(30_000)
    yield p
    context.close()


def screenshot(page: Any, name: str) -> Path:
    """Save a full-page screenshot as a test artifact; returns its path."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path
