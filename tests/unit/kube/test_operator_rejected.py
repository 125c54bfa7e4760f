"""The operator's LMService status reads rejected requests from the store."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from pathlib import Path

import pytest

from lmedge.api import RequestRecord
from lmedge.operator import handlers
from lmedge.operator.logic import lmservice_status
from lmedge.store import RunInfo, open_store


def _record(i: int, outcome: str) -> RequestRecord:
    return RequestRecord.model_validate(
        {"id": f"q{i}", "run": "r1", "lm": "lm4", "origin": "w1", "destination": "w1",
         "prompts": 1, "slot": 0, "submit_s": float(i), "outcome": outcome,
         "queue_s": 10.0 if outcome == "success" else 0.0}
    )  # fmt: skip


def test_status_counts_rejected_requests_as_failures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store_dir = tmp_path / "store"
    with open_store(str(store_dir)) as store:
        store.record_run(
            RunInfo(id="r1", scenario="t", policy="ma", seed=1, started=datetime.now(UTC))
        )
        outcomes = ["success"] * 5 + ["rejected"] * 3 + ["timeout"] * 2
        store.record_requests([_record(i, o) for i, o in enumerate(outcomes)])
    monkeypatch.setenv("LMEDGE_STORE", str(store_dir))
    try:
        stats = handlers._service_stats("ns", "lm4", logging.getLogger("test"))
    finally:
        handlers.close_store()
    assert stats is not None and (stats.requests, stats.rejected) == (10, 3)
    status = lmservice_status([], stats, 1)
    assert (status["successRatio"], status["rejectedRatio"]) == (0.5, 0.3)


def test_status_ticks_share_one_store_and_report_the_window(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import lmedge.store as store_module

    store_dir = tmp_path / "store"
    with open_store(str(store_dir)) as store:
        store.record_run(
            RunInfo(id="r1", scenario="t", policy="ma", seed=1, started=datetime.now(UTC))
        )
        store.record_requests([_record(i, "timeout") for i in range(4)])
    monkeypatch.setenv("LMEDGE_STORE", str(store_dir))
    opened: list[str] = []
    real = store_module.open_store

    def counting(uri: str | None = None, **kwargs: object) -> object:
        opened.append(str(uri))
        return real(uri, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(store_module, "open_store", counting)
    log = logging.getLogger("test")
    try:
        first = handlers._service_stats("ns2", "lm4", log)
        handlers.shared_store().record_requests(  # type: ignore[union-attr]
            [_record(10 + i, "success") for i in range(4)]
        )
        handlers.shared_store().flush()  # type: ignore[union-attr]
        second = handlers._service_stats("ns2", "lm4", log)
    finally:
        handlers.close_store()
    assert len(opened) == 1  # one connection for every tick of every LMService
    assert first is not None and (first.requests, first.success_ratio) == (4, 0.0)
    # the second tick's window holds only what came after the first
    assert second is not None and (second.requests, second.success_ratio) == (4, 1.0)
