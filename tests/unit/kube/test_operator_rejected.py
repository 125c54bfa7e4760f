"""The operator's LMService status reads rejected requests from the store."""

from __future__ import annotations

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
    stats = handlers._service_stats("lm4")
    assert stats is not None and (stats.requests, stats.rejected) == (10, 3)
    status = lmservice_status([], stats, 1)
    assert (status["successRatio"], status["rejectedRatio"]) == (0.5, 0.3)
