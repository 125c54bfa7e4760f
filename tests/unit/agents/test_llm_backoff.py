"""The LLM client's one back-off rule (llm._Backoff), on a fake clock."""

from __future__ import annotations

import pytest

from lmedge.agents import llm


@pytest.mark.parametrize(
    ("retries", "left_s", "pauses"),
    [
        (3, 100.0, [0.2, 0.4, 0.8]),
        (0, 100.0, []),
        (3, 0.4, []),
        (3, 1.0, [0.2]),
        (3, 0.6, [0.15]),
    ],
    ids=[
        "doubles-per-retry",
        "no-retries",
        "pause-does-not-fit",
        "budget-runs-out",
        "a-quarter-of-what-is-left",
    ],
)
def test_a_retry_pauses_only_while_retries_and_budget_last(
    monkeypatch: pytest.MonkeyPatch, retries: int, left_s: float, pauses: list[float]
) -> None:
    now = [0.0]
    slept: list[float] = []

    def sleep(s: float) -> None:
        slept.append(s)
        now[0] += s

    monkeypatch.setattr(llm.time, "sleep", sleep)
    backoff = llm._Backoff(retries, deadline=left_s, clock=lambda: now[0])
    while backoff.wait():
        pass
    assert slept == pytest.approx(pauses)
