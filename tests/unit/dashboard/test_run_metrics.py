"""The run page's token-level, load-balance and routing-window cards, and window decisions.

LYREO's metrics are checked on a real emulated run stored in the embedded
store (`lmedge simulate -f examples/lyreo --store`): cut at its measured
slots, the page shows what the run's own summary reported. A cluster run's
windows are stored by its gateways as window decisions, built here.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import Literal

import pytest
from fastapi.testclient import TestClient

from lmedge.api.decisions import (
    WINDOW_TRIGGER,
    Decision,
    RoutedRequest,
    RoutingMap,
    WindowAudit,
)
from lmedge.api.records import RequestRecord
from lmedge.dashboard.app import create_app
from lmedge.metrics import window_totals
from lmedge.store import RunInfo, open_store
from tests.e2e.cli import cli

SLOTS = 20


def cards(page: str, section: str | None = None) -> dict[str, str]:
    """The cards of a page (of one `<div class="cards" id=section>` when given)."""
    if section is not None:
        match = re.search(rf'<div class="cards" id="{section}">(.*?)\n</div>', page, re.S)
        assert match, f"no cards {section!r}"
        page = match.group(1)
    found = re.findall(
        r'data-metric="([a-z_0-9]+)"><div class="label">.*?</div><div class="value">(.*?)</div>',
        page,
    )
    return {k: html.unescape(v) for k, v in found}


def pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def test_a_lyreo_run_shows_its_summarys_token_balance_and_window_figures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = str(tmp_path / "db")
    args = ["simulate", "-f", "examples/lyreo", "--policy", "lyreo-ly", "--slots", str(SLOTS)]
    code, out, err = cli([*args, "--store", db, "--json", "--timings"], capsys)
    assert code == 0, err
    summary = json.loads(out)
    with open_store(db, read_only=True) as store, TestClient(create_app(store)) as client:
        run = store.runs()[0].id
        page = client.get(f"/runs/{run}", params={"end": SLOTS})
    assert page.status_code == 200
    got = cards(page.text)
    balance, (lm,) = summary["balance"], summary["tokens"]["per_lm"]
    assert got["p99_latency_s"] == f"{balance['p99_latency_s']:.2f}"
    assert got["mean_latency_s"] == f"{balance['mean_latency_s']:.1f}"
    # one serving LM: the run's TTFT and TPOT are its LM's
    assert got["ttft_s_mean"] == f"{lm['ttft_s_mean']:.3f}"
    assert got["ttft_s_p99"] == f"{lm['ttft_s_p99']:.3f}"
    assert got["tpot_s_mean"] == f"{1000 * lm['tpot_s_mean']:.2f}"
    assert got["tpot_s_p99"] == f"{1000 * lm['tpot_s_p99']:.2f}"
    row = re.search(rf'<tr data-lm="{lm["lm"]}">(.*?)</tr>', page.text, re.S)
    assert row and f'<td class="n">{lm["requests"]}</td>' in row.group(1)
    # Y, Z and the high-KV share: stored when the run ended, over its measured slots
    assert got["mean_deviation"] == f"{balance['mean_deviation']:.4f}"
    assert got["mean_virtual_queue"] == f"{balance['mean_virtual_queue']:.4f}"
    assert got["high_kv_share"] == pct(balance["high_kv_share"])
    assert f"over the run's {balance['slots']} measured slots" in page.text
    # LYREO routes each request in windows but reports no J: counts only, no J cards
    timing = summary["timing"]
    windows = cards(page.text, "windows")
    assert windows["windows"] == str(timing["route_windows"])
    assert "window_j_mean" not in windows and "window_cost" not in windows
    assert "routing" not in summary or "windows" not in summary["routing"]


def test_an_emulated_cema_runs_windows_reach_the_store_as_its_summary_reports_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = str(tmp_path / "db")
    args = ["simulate", "-f", "examples/model-routing", "--policy", "cema-request"]
    code, out, err = cli([*args, "--slots", "3", "--no-settle", "--store", db, "--json"], capsys)
    assert code == 0, err
    summary = json.loads(out)["routing"]["windows"]
    with open_store(db, read_only=True) as store, TestClient(create_app(store)) as client:
        run = store.runs()[0].id
        stored = store.totals(run)
        page = client.get(f"/runs/{run}")
        # one bounded document for the run, no document per window
        assert store.decisions(run=run, windows=True, limit=10) == []
    assert stored is not None and stored.windows is not None and stored.balance is None
    w = stored.windows
    assert (w.reported, w.requests) == (summary["windows"], summary["requests"])
    for key in ("j_mean", "seed_j_mean", "quality_loss_mean", "cost", "energy_j"):
        assert getattr(w, key) == summary[key], key
    got = cards(page.text, "windows")
    assert got["window_j_mean"] == f"{summary['j_mean']:.3f}"
    assert got["window_seed_j_mean"] == f"{summary['seed_j_mean']:.3f}"
    assert got["window_makespan_s_mean"] == f"{summary['makespan_s_mean']:.2f}"
    assert 'id="tokens-none"' in page.text and 'id="balance-none"' in page.text


def _record(k: int, slot: int, outcome: str = "success") -> RequestRecord:
    return RequestRecord(
        id=f"q{k}",
        run="r",
        lm="lm1",
        origin="w1",
        destination="w2",
        prompts=1,
        slot=slot,
        submit_s=30.0 * slot,
        inference_s=2.0 + k,
        outcome=outcome,  # type: ignore[arg-type]
    )


def test_a_pipeline_run_says_what_it_did_not_measure(tmp_path: Path) -> None:
    with open_store(str(tmp_path / "db")) as store:
        store.record_run(RunInfo(id="r", scenario="testbed", policy="MA"))
        store.record_requests([_record(k, 0) for k in range(3)])
        store.flush()
    with (
        open_store(str(tmp_path / "db"), read_only=True) as store,
        TestClient(create_app(store)) as client,
    ):
        page = client.get("/runs/r")
    assert page.status_code == 200
    got = cards(page.text)
    assert got["p99_latency_s"] == "4.00"  # successes' latencies 2, 3, 4 s
    for absent in ("ttft_s_mean", "mean_deviation", "windows", "window_j_mean"):
        assert absent not in got
    for said in ("tokens-none", "balance-none", "windows-none"):
        assert f'id="{said}"' in page.text
    assert "not measured" in page.text


def _window(
    node: str,
    slot: int,
    start_s: float,
    used: Literal["router", "seed", "map"],
    j: float | None,
    seed_j: float | None = None,
) -> Decision[RoutingMap]:
    terms = {} if j is None else {"quality_loss": j / 2, "cost": 0.5, "energy": 300.0}
    return Decision[RoutingMap](
        agent="scheduler",
        policy="cema-request",
        source="rule" if used == "router" else "fallback",
        value=RoutingMap(routes=[]),
        run="r",
        slot=slot,
        node=node,
        outcome="accepted" if used == "router" else "replaced",
        error=None if used == "router" else "router past its budget",
        latency_s=0.004,
        sim_time_s=start_s + 1.0,
        trigger=WINDOW_TRIGGER,
        window=WindowAudit(
            start_s=start_s,
            end_s=start_s + 1.0,
            requests=2,
            used=used,
            wait_s=0.004 if used == "router" else 0.2,
            routes=[
                RoutedRequest(request=f"{node}-{start_s}-{i}", destination="w2") for i in (0, 1)
            ],
            j=j,
            seed_j=seed_j,
            makespan=None if j is None else 3.0,
            **terms,
        ),
    )


def test_a_cluster_runs_window_decisions_are_summed_charted_and_labelled(tmp_path: Path) -> None:
    slot_map = Decision[RoutingMap](
        agent="scheduler",
        policy="cema-request",
        source="rule",
        value=RoutingMap(routes=[]),
        run="r",
        slot=1,
    )
    windows = [
        _window("w1", 0, 1.0, "router", 0.2, 0.4),
        _window("w2", 0, 2.0, "router", 0.4, 0.4),
        _window("w1", 1, 31.0, "seed", None),
        _window("w1", 2, 61.0, "router", 0.1, 0.3),
    ]
    with open_store(str(tmp_path / "db")) as store:
        store.record_run(RunInfo(id="r", scenario="cluster", policy="cema", backend="kubernetes"))
        store.record_requests([_record(k, k % 3) for k in range(6)])
        store.record_decisions([*windows, slot_map])
        store.flush()
    with (
        open_store(str(tmp_path / "db"), read_only=True) as store,
        TestClient(create_app(store)) as client,
    ):
        page = client.get("/runs/r")
        first_two = client.get("/runs/r", params={"end": 2})
        only_windows = client.get("/runs/r/decisions", params={"kind": "window"})
        only_maps = client.get("/runs/r/decisions", params={"kind": "slot", "agent": "scheduler"})
        audit = client.get(
            "/runs/r/decisions/scheduler/0", params={"node": "w2", "window_start": "2.0"}
        )
        the_map = client.get("/runs/r/decisions/scheduler/1")
        missing = client.get(
            "/runs/r/decisions/scheduler/0", params={"node": "w2", "window_start": "9.0"}
        )
    want = window_totals(w.window for w in windows if w.window is not None)
    assert want is not None
    got = cards(page.text, "windows")
    assert got == {
        "windows": "4",
        "window_j_mean": f"{want.j_mean:.3f}",
        "window_seed_j_mean": f"{want.seed_j_mean:.3f}",
        "window_quality_loss_mean": f"{want.quality_loss_mean:.3f}",
        "window_cost": f"{want.cost:.3f}",
        "window_energy_j": f"{want.energy_j / 1000:.1f}",
        "window_makespan_s_mean": f"{want.makespan_s_mean:.2f}",
        "window_decision_ms": f"{1000 * want.decision_s_mean:.2f}",
    }
    assert "1 windows not routed by the router" in page.text
    assert 'id="chart-windows"' in page.text
    assert 'id="balance-none"' in page.text and "a cluster run stores no KV" in page.text
    # the slot range applies to audited windows: slot 2's is not counted
    assert cards(first_two.text, "windows")["windows"] == "3"
    # the timeline and table tell windows from slot maps
    assert only_windows.status_code == 200
    assert only_windows.text.count('data-kind="window"') == 4
    assert 'data-kind="slot"' not in only_windows.text
    assert "scheduler: routing window" in only_windows.text
    assert "window_start=2.0" in only_windows.text
    assert only_maps.text.count('data-kind="slot"') == 1
    assert 'data-kind="window"' not in only_maps.text
    assert audit.status_code == 200 and 'id="window-audit"' in audit.text
    assert "w2-2.0-1" in audit.text
    assert the_map.status_code == 200 and 'id="window-audit"' not in the_map.text
    assert missing.status_code == 404 and "routing window opened at 9.0 s" in missing.text
