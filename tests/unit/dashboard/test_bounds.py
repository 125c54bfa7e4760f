"""One URL cannot exhaust the dashboard: query parameters are bounded by what the
run recorded, and a page computing keeps no other page waiting.

The real app over a real (embedded) store.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from lmedge.api.decisions import Decision, LMPlacement, Placement
from lmedge.api.records import RequestRecord
from lmedge.dashboard import views
from lmedge.dashboard.app import create_app
from lmedge.store import RunInfo, open_store

#: Slots the test run records (requests in 0..SLOTS-1, deployer decisions too).
SLOTS = 6


def _record(slot: int) -> RequestRecord:
    return RequestRecord(
        id=f"q{slot}",
        lm="lm1",
        origin="w1",
        destination="w1",
        prompts=1,
        slot=slot,
        submit_s=slot * 30.0,
        inference_s=2.0,
        outcome="success",
    )


def _placement(slot: int) -> Decision[Placement]:
    lms = [LMPlacement(lm="lm1", mode="cpu", cpu_cores=2.0, vgpus=0)]
    return Decision[Placement](
        agent="deployer",
        policy="rule",
        source="rule",
        value=Placement(node="w1", lms=lms),
        run="r",
        epoch=slot // 3,
        slot=slot,
        node="w1",
    )


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    db = str(tmp_path_factory.mktemp("store") / "db")
    with open_store(db) as store:
        store.record_run(RunInfo(id="r", scenario="testbed", policy="MA"))
        store.record_requests(_record(s) for s in range(SLOTS))
        store.record_decisions(_placement(s) for s in range(SLOTS))
        store.flush()
    with open_store(db, read_only=True) as store, TestClient(create_app(store)) as c:
        yield c


@pytest.mark.parametrize(
    ("url", "bound"),
    [
        ("/runs/r?window=1&end=1000000", f"end is at most {SLOTS}"),
        (f"/runs/r?start={SLOTS + 1}", f"start is at most {SLOTS}"),
        ("/runs/r?window=10001", "less than or equal to 10000"),
        (f"/runs/r/decisions?slot={SLOTS}", f"slot is at most {SLOTS - 1}"),
        ("/runs/r/decisions?epoch=99", "epoch is at most 1"),
        ("/runs/r/decisions?limit=501", "less than or equal to 500"),
    ],
    ids=["end", "start", "window", "decision-slot", "decision-epoch", "limit"],
)
def test_a_parameter_past_the_run_is_a_400_stating_the_bound(
    client: TestClient, url: str, bound: str
) -> None:
    page = client.get(url)
    assert page.status_code == 400
    assert bound in page.text


@pytest.mark.parametrize(
    "url",
    [f"/runs/r?window=1&end={SLOTS}", f"/runs/r?start={SLOTS}", "/runs/r/decisions?slot=0"],
    ids=["end-at-the-bound", "start-at-the-end", "first-slot"],
)
def test_parameters_inside_the_run_are_served(client: TestClient, url: str) -> None:
    assert client.get(url).status_code == 200


def test_a_page_computing_keeps_no_other_page_waiting(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While one run page computes its metrics, another page reads the store and answers.

    The computation waits for the other page; holding the store lock meanwhile
    would keep that page waiting until the computation gives up (then it fails).
    """
    computing, other_done = threading.Event(), threading.Event()
    waited: list[bool] = []
    real = views.segment_metrics

    def slow(*args: Any, **kwargs: Any) -> Any:
        computing.set()
        waited.append(other_done.wait(timeout=60))
        return real(*args, **kwargs)

    monkeypatch.setattr(views, "segment_metrics", slow)
    statuses: list[int] = []
    worker = threading.Thread(target=lambda: statuses.append(client.get("/runs/r").status_code))
    worker.start()
    assert computing.wait(timeout=120)
    assert client.get("/").status_code == 200
    other_done.set()
    worker.join(timeout=120)
    assert waited == [True] and statuses == [200]


def test_a_run_without_records_bounds_at_zero(tmp_path: Path) -> None:
    with open_store(str(tmp_path / "db")) as store:
        store.record_run(RunInfo(id="e", scenario="testbed", policy="MA"))
        store.flush()
    with (
        open_store(str(tmp_path / "db"), read_only=True) as store,
        TestClient(create_app(store)) as client,
    ):
        assert client.get("/runs/e?end=1").status_code == 400
        assert "recorded 0 slots" in client.get("/runs/e?end=1").text
