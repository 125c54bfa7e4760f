"""Pure parts of the dashboard: liveness, login redirects, report folders."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from lmedge.api.engine_telemetry import EngineTelemetry
from lmedge.api.records import NodeTelemetry, RequestRecord
from lmedge.dashboard import views
from lmedge.dashboard.app import _local, create_app
from lmedge.dashboard.views import NotFound, find_reports, is_live, load_report, report_file
from lmedge.store import RunInfo, open_store

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("age_s", "live"), [(0, True), (119, True), (121, False)], ids=["now", "inside", "past"]
)
def test_a_run_is_live_while_it_decided_recently(age_s: float, live: bool) -> None:
    assert is_live(NOW - timedelta(seconds=age_s), 120.0, now=NOW) is live


def test_a_run_without_decisions_is_not_live() -> None:
    assert is_live(None, 120.0, now=NOW) is False


@pytest.mark.parametrize(
    ("target", "kept"),
    [("/runs/x?window=5", "/runs/x?window=5"), ("//evil.example/", "/"), ("https://e/", "/")],
    ids=["local", "scheme-relative", "absolute"],
)
def test_login_redirects_stay_on_the_site(target: str, kept: str) -> None:
    assert _local(target) == kept


#: A scenario row with every field the reports page shows.
ROW = {
    "objective": 0.1,
    "jain": 0.9,
    "mean_latency_s": 2.0,
    "success_ratio": 1.0,
    "rejected_ratio": 0.0,
    "conflict_ratio": None,
    "seeds": [1],
}


def _report(folder: Path, figures: tuple[str, ...]) -> None:
    folder.mkdir(parents=True)
    rows = {"testbed": {"ma": ROW}}
    (folder / "summary.json").write_text(json.dumps({"runs": [], "scenarios": rows}))
    for f in figures:
        (folder / f).write_bytes(b"x")


def test_reports_are_found_two_levels_deep_and_flattened(tmp_path: Path) -> None:
    root = tmp_path / "reports"
    _report(root / "demo", ("fig6-testbed.png", "fig6-testbed.svg", "fig7-testbed.png"))
    _report(root / "bench" / "a", ())
    (root / "empty").mkdir()
    found = find_reports([root])
    assert list(found) == ["reports/bench/a", "reports/demo"]
    report = load_report("reports/demo", found)
    assert report.scenarios == [{"scenario": "testbed", "policy": "ma", **ROW}]
    # An SVG and a PNG of one figure: the SVG only.
    assert report.figures == ["fig6-testbed.svg", "fig7-testbed.png"]


def test_only_a_reports_own_figures_are_served(tmp_path: Path) -> None:
    root = tmp_path / "reports"
    _report(root / "demo", ("fig6-testbed.png",))
    report = load_report("reports/demo", find_reports([root]))
    assert report_file(report, "fig6-testbed.png") == root / "demo" / "fig6-testbed.png"
    for bad in ("summary.json", "../demo/fig6-testbed.png", "/etc/passwd"):
        with pytest.raises(NotFound):
            report_file(report, bad)
    with pytest.raises(NotFound, match="no report 'other'"):
        load_report("other", find_reports([root]))


def test_the_cluster_view_keeps_the_fullest_kv_cache_per_node_and_slot(tmp_path: Path) -> None:
    def snap(node: str, t: float, *kv: float | None) -> NodeTelemetry:
        engines = [EngineTelemetry(lm=f"lm{i}", kv_cache_usage=v) for i, v in enumerate(kv)]
        return NodeTelemetry(
            run="r", node=node, time_s=t, cpu_util=0, memory_util=0, engines=engines or None
        )

    with open_store(str(tmp_path / "db")) as store:
        store.record_run(RunInfo(id="r", scenario="testbed", policy="MA"))
        store.record_telemetry(
            [
                snap("w1", 1.0, 0.2, 0.7),
                snap("w1", 20.0, 0.4),  # same 30 s slot: the fuller one stays
                snap("w1", 31.0, None),  # an engine without the gauge: no cell
                snap("w2", 31.0),  # pipeline only
            ]
        )
        store.flush()
        cs = views.cluster_state(views.read_cluster(store, "r"), None)
    assert cs.kv_usage == {("w1", 0): pytest.approx(0.7)}
    assert cs.kv_slots == [0]
    with (
        open_store(str(tmp_path / "db"), read_only=True) as store,
        TestClient(create_app(store)) as client,
    ):
        page = client.get("/runs/r/cluster")
    assert page.status_code == 200 and 'id="chart-kv"' in page.text


@pytest.mark.parametrize(
    ("energies", "card"),
    [([1500.0, 2500.0, None], "4.0"), ([None], "–")],
    ids=["emulated-energy", "none-recorded"],
)
def test_the_run_page_shows_the_energy_its_requests_recorded(
    tmp_path: Path, energies: list[float | None], card: str
) -> None:
    records = [
        RequestRecord(
            id=f"q{k}",
            run="r",
            lm="lm1",
            origin="w1",
            destination="w1",
            prompts=1,
            slot=0,
            submit_s=0.0,
            outcome="success",
            energy_j=e,
        )
        for k, e in enumerate(energies)
    ]
    with open_store(str(tmp_path / "db")) as store:
        store.record_run(RunInfo(id="r", scenario="testbed", policy="MA"))
        store.record_requests(records)
        store.flush()
    with (
        open_store(str(tmp_path / "db"), read_only=True) as store,
        TestClient(create_app(store)) as client,
    ):
        page = client.get("/runs/r")
    assert page.status_code == 200
    value = page.text.split('data-metric="energy_j"', 1)[1].split('class="value">', 1)[1]
    assert value.split("<", 1)[0].strip() == card
