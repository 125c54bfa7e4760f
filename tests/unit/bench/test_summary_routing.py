"""`routing_summary`: the run's emulated energy and a request-level router's window means."""

from __future__ import annotations

import pytest

from lmedge.api import RequestRecord
from lmedge.bench.summary import routing_summary
from lmedge.bench.tally import QuantileTally


def record(energy: float | None) -> RequestRecord:
    return RequestRecord(
        id="r",
        lm="a",
        origin="n",
        destination="n",
        prompts=1,
        slot=0,
        submit_s=0.0,
        outcome="success",
        energy_j=energy,
    )


@pytest.mark.parametrize(
    ("energies", "total", "mean"),
    [([10.0, 30.0, None], 40.0, 20.0), ([None], 0, None), ([], 0, None)],
    ids=["some-recorded", "none-recorded", "no-requests"],
)
def test_energy_sums_the_records_that_carry_one(
    energies: list[float | None], total: float, mean: float | None
) -> None:
    tally = QuantileTally()
    for r in (record(e) for e in energies):
        if r.energy_j is not None:  # as RunTally.finished folds them
            tally.add(r.energy_j)
    out = routing_summary(tally)
    assert (out["energy_j"], out["energy_j_per_request"]) == (total, mean)
    assert "windows" not in out


def test_window_totals_become_means() -> None:
    totals = {
        "windows": 4.0,
        "requests": 10.0,
        "j": 2.0,
        "seed_j": 2.4,
        "quality_loss": 0.8,
        "cost": 1.5,
        "energy": 100.0,
        "makespan": 40.0,
    }
    w = routing_summary(QuantileTally(), totals)["windows"]
    assert w == {
        "windows": 4,
        "requests": 10,
        "j_mean": 0.5,
        "seed_j_mean": 0.6,
        "quality_loss_mean": 0.2,
        "cost": 1.5,
        "energy_j": 100.0,
        "makespan_s_mean": 10.0,
    }
