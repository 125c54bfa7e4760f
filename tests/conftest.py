"""Shared pytest configuration: fixture plugins for the real test servers."""

from __future__ import annotations

import os
import sys
import threading

import pytest

pytest_plugins = [
    "tests.fixtures.ferretdb",
    "tests.fixtures.llm_server",
    "tests.fixtures.llama_server",
    "tests.fixtures.cluster",
    "tests.fixtures.plugins",
]

_EXIT_STATUS: list[int] = []


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _EXIT_STATUS.append(int(exitstatus))


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """End the process with the session's status once pytest has reported.

    The suite loads native libraries that keep threads of their own (Ray's
    core worker, torch, FAISS, Playwright's greenlets); once, after every test
    had passed, the interpreter's teardown aborted in one of them and turned a
    green run red. The result is the session's: name what is still running,
    flush, and exit with it.
    """
    if not _EXIT_STATUS or config.option.collectonly:
        return
    alive = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
    if alive:
        print(f"\nthreads still running at exit: {', '.join(sorted(alive))}", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(_EXIT_STATUS[-1])
