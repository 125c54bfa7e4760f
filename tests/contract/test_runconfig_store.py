"""A run's configuration is stored with it and read back by id or as the newest cluster run."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

from lmedge.api.constants import LoopConstants
from lmedge.api.runconfig import PolicyConfig, RunConfig
from lmedge.processes.node_agent import await_run
from lmedge.store import RunInfo, Store

T0 = datetime(2026, 1, 1, tzinfo=UTC)
CONFIG = RunConfig(
    loop=LoopConstants(slot_s=2, epoch_slots=5, tau_s=120, lam=0.3),
    policy=PolicyConfig(profile="rf", deployer="lyapunov", params={"deployer": {"a": "1"}}),
)


def _run(run_id: str, backend: str, minutes: int, config: RunConfig | None) -> RunInfo:
    return RunInfo(
        id=run_id,
        scenario="kubernetes",
        policy="RF",
        started=T0 + timedelta(minutes=minutes),
        backend=backend,
        config=config,
    )


def test_the_config_comes_back_with_its_run(store: Store) -> None:
    store.record_run(_run("k8s-1", "kubernetes", 0, CONFIG))
    store.record_run(_run("old", "kubernetes", -5, None))
    store.record_run(_run("sim-later", "emulated", 5, RunConfig()))
    store.flush()

    found = store.run("k8s-1")
    assert found is not None and found.config == CONFIG
    latest = store.latest_run(backend="kubernetes")
    assert latest is not None and latest.id == "k8s-1"  # the emulated run is newer
    assert store.run("nothing") is None
    old = store.run("old")
    assert old is not None and old.config is None


def test_a_node_agent_waits_for_the_controllers_run(store: Store) -> None:
    stop = threading.Event()
    polls: list[int] = []

    class Late:
        """The store, where the controller records the run after the agent's second look."""

        def run(self, run_id: str) -> RunInfo | None:
            polls.append(1)
            if len(polls) == 2:
                store.record_run(_run("k8s-2", "kubernetes", 0, CONFIG))
                store.flush()
            return store.run(run_id)

    found = await_run(Late(), "k8s-2", stop, poll_s=0.01)  # type: ignore[arg-type]
    assert found is not None and found.config == CONFIG and len(polls) == 2  # waited once


def test_waiting_ends_without_a_run_when_stopped(store: Store) -> None:
    stop = threading.Event()
    stop.set()
    assert await_run(store, "", stop, poll_s=0.01) is None


def test_a_newer_cluster_run_supersedes_the_one_served(store: Store) -> None:
    from lmedge.nodeagent.agent import newer_run

    serving = _run("k8s-now", "kubernetes", 0, CONFIG)
    store.record_run(serving)
    store.record_run(_run("k8s-before", "kubernetes", -5, CONFIG))
    store.record_run(_run("sim-after", "emulated", 5, RunConfig()))
    store.flush()
    assert newer_run(store, serving) is None  # older runs and emulator runs are no news
    store.record_run(_run("k8s-restarted", "kubernetes", 3, CONFIG))
    store.flush()
    assert newer_run(store, serving) == "k8s-restarted"


def test_a_store_that_cannot_answer_supersedes_nothing() -> None:
    from lmedge.nodeagent.agent import newer_run

    class Down:
        def latest_run(self, *, backend: str | None = None) -> RunInfo | None:
            raise ConnectionError("store down")

    assert newer_run(Down(), _run("k8s-now", "kubernetes", 0, CONFIG)) is None  # type: ignore[arg-type]
