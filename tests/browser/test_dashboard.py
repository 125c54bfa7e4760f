"""The dashboard in a real browser: what a person sees matches the store.

A real `lmedge simulate --store` fills the store, a real `lmedge dashboard`
process serves it, Debian's chromium (headless, through Playwright) opens each
view. Expected numbers come from the simulation's own summary (`--json`) and
from the store read with the `Store` API, never from the page.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from lmedge.api import Decision, LMPlacement, Placement, RequestRecord
from lmedge.store import RunInfo, open_store

from .conftest import SLOTS, Dashboard, FilledStore, screenshot


def pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def card(page: Any, metric: str) -> str:
    return str(page.locator(f'#headline [data-metric="{metric}"] .value').inner_text()).strip()


def test_runs_list_names_the_run_with_its_request_count(
    page: Any, dashboard: Dashboard, filled_store: FilledStore
) -> None:
    page.goto(dashboard.url + "/")
    row = page.locator(f'#runs tr[data-run="{filled_store.run}"]')
    with open_store(str(filled_store.path), read_only=True) as store:
        stored = sum(s.arrivals for s in store.lm_stats(filled_store.run))
    assert row.locator("td.requests").inner_text() == str(stored)
    assert row.locator("td .done").inner_text() == "ended"  # no decision in the last second
    screenshot(page, "runs")
    row.get_by_role("link", name=filled_store.run).click()
    assert page.locator("h1").inner_text().startswith(filled_store.run)


def test_run_view_shows_the_simulations_own_numbers(
    page: Any, dashboard: Dashboard, filled_store: FilledStore
) -> None:
    """Cut at the measured slots, the page shows what `lmedge simulate --json` reported."""
    page.goto(f"{dashboard.url}/runs/{filled_store.run}")
    page.fill('#range input[name="end"]', str(SLOTS))
    page.click("#range button")
    page.wait_for_url(re.compile(rf"end={SLOTS}"))
    s = filled_store.summary
    assert card(page, "objective") == f"{s['objective']:.3f}"
    assert card(page, "jain") == f"{s['jain']:.3f}"
    assert card(page, "lm_mean_latency_s") == f"{s['lm_mean_latency_s']:.1f}"
    penalized = s["lm_mean_penalized_latency_s"]
    assert card(page, "lm_mean_penalized_latency_s") == f"{penalized:.1f}"
    assert card(page, "mean_latency_s") == f"{s['mean_latency_s']:.1f}"
    assert card(page, "success_ratio") == pct(s["success_ratio"])
    assert card(page, "requests") == str(s["requests"])
    assert card(page, "rejected_ratio") == pct(s["rejected_ratio"])
    assert card(page, "conflict_ratio") == pct(s["conflicts"]["ratio"] or 0.0)
    for lm in s["per_lm"]:
        row = page.locator(f'#per-lm tr[data-lm="{lm["lm"]}"] td')
        assert row.nth(1).inner_text() == str(lm["arrivals"])
        assert row.nth(2).inner_text() == str(lm["successes"])
    # The success chart draws each LM's per-window success ratio (paper Fig. 6).
    with open_store(str(filled_store.path), read_only=True) as store:
        records = [r for r in store.requests(filled_store.run) if r.slot < SLOTS]
    first = [r for r in records if r.slot < 10]
    lm = first[0].lm
    expected = sum(r.outcome == "success" for r in first if r.lm == lm) / sum(
        r.lm == lm for r in first
    )
    dot = page.locator(f'#chart-success circle[data-series="{lm}"][data-x="0"]')
    assert float(dot.get_attribute("data-y")) == pytest.approx(expected, abs=1e-5)
    assert page.locator("#chart-latency line.reference").count() == 1  # the deadline tau
    screenshot(page, "run")


def test_cluster_view_shows_the_latest_placements_and_the_macro_policy(
    page: Any, dashboard: Dashboard, filled_store: FilledStore
) -> None:
    with open_store(str(filled_store.path), read_only=True) as store:
        deployments = store.decisions(agent="deployer", run=filled_store.run, limit=10_000)
        plans = store.decisions(agent="planner", run=filled_store.run, limit=100)
    latest: dict[str, Any] = {}
    for d in deployments:  # newest first
        latest.setdefault(d.node, d)
    page.goto(f"{dashboard.url}/runs/{filled_store.run}/cluster")
    for node, d in latest.items():
        active = [p for p in d.value.lms if p.mode != "off"]
        rows = page.locator(f'#placements tr[data-node="{node}"][data-lm]')
        assert rows.count() == len(active), node
        for p in active:
            cells = page.locator(f'#placements tr[data-node="{node}"][data-lm="{p.lm}"] td')
            assert cells.nth(3).inner_text() == p.mode
            assert float(cells.nth(4).inner_text()) == p.cpu_cores
            assert int(cells.nth(5).inner_text()) == p.vgpus
    plan = plans[0].value
    roles = {(lm, r.node) for r in plan.roles for lm in r.lms}
    marked = page.locator('#chart-policy rect.cell[data-mark="●"]')
    shown = {
        (marked.nth(i).get_attribute("data-row"), marked.nth(i).get_attribute("data-col"))
        for i in range(marked.count())
    }
    assert shown == roles
    w = plan.routing[0].weights[0]
    cell = page.locator(
        f'#chart-policy rect.cell[data-row="{plan.routing[0].lm}"][data-col="{w.node}"]'
    )
    assert float(cell.get_attribute("data-value")) == pytest.approx(w.p, abs=1e-5)
    assert page.locator("#chart-backlog rect.cell").count() > 0
    screenshot(page, "cluster")
    # An earlier epoch's policy, picked in the form.
    page.select_option('select[name="epoch"]', str(plans[-1].epoch))
    page.get_by_role("button", name="show").click()
    page.wait_for_url(re.compile(rf"epoch={plans[-1].epoch}"))
    assert f"epoch {plans[-1].epoch}" in page.locator("#chart-policy").get_attribute("aria-label")


def test_decision_filters_narrow_the_timeline(
    page: Any, dashboard: Dashboard, filled_store: FilledStore
) -> None:
    with open_store(str(filled_store.path), read_only=True) as store:
        expected = store.decisions(
            agent="deployer", run=filled_store.run, node="worker-2", limit=500
        )
    page.goto(f"{dashboard.url}/runs/{filled_store.run}/decisions")
    page.select_option('#filters select[name="agent"]', "deployer")
    page.fill('#filters input[name="node"]', "worker-2")
    page.click('#filters button[type="submit"]')
    page.wait_for_url(re.compile(r"agent=deployer"))
    rows = page.locator("#decisions tr[data-agent]")
    assert rows.count() == len(expected)
    agents = set(rows.evaluate_all("rs => rs.map(r => r.dataset.agent)"))
    nodes = set(rows.evaluate_all("rs => rs.map(r => r.dataset.node)"))
    assert (agents, nodes) == ({"deployer"}, {"worker-2"})
    assert page.locator("#chart-decisions circle.mark").count() == len(expected)
    # Only the LLM's decisions: the one replaced reply.
    page.goto(f"{dashboard.url}/runs/{filled_store.run}/decisions?source=llm")
    rows = page.locator("#decisions tr[data-agent]")
    assert rows.count() == 1
    assert rows.first.get_attribute("data-outcome") == "replaced"
    assert filled_store.violations[0] in rows.first.locator("td.violation").inner_text()
    page.goto(f"{dashboard.url}/runs/{filled_store.run}/decisions")
    screenshot(page, "decisions")


def test_one_decision_in_full_shows_its_violations_reply_and_replacement(
    page: Any, dashboard: Dashboard, filled_store: FilledStore
) -> None:
    page.goto(f"{dashboard.url}/runs/{filled_store.run}/decisions?outcome=replaced")
    page.locator("#decisions tr[data-agent]").first.get_by_role("link", name="details").click()
    page.wait_for_url(re.compile(rf"/decisions/scheduler/{filled_store.replaced_slot}"))
    shown = page.locator("#violations li").all_inner_texts()
    assert shown == list(filled_store.violations)
    assert page.locator("#raw").inner_text() == filled_store.raw
    assert '"destination": "worker-3"' in page.locator("#value").inner_text()  # the replacement
    assert "replaced" in page.locator("#decision-facts").inner_text()
    # The telemetry it was shown: the newest snapshot of every node at its run time.
    with open_store(str(filled_store.path), read_only=True) as store:
        telemetry = store.telemetry(run=filled_store.run, limit=0)
    at = filled_store.replaced_slot * 30.0
    nodes = {t.node for t in telemetry if t.time_s <= at}
    assert (
        set(
            page.locator("#telemetry tr[data-node]").evaluate_all(
                "rs => rs.map(r => r.dataset.node)"
            )
        )
        == nodes
    )
    screenshot(page, "decision")


@pytest.mark.parametrize(
    ("path", "status", "message"),
    [
        ("/runs/no-such-run", 404, "no run 'no-such-run'"),
        ("/runs/{run}?window=0", 400, "window: Input should be greater than or equal to 1"),
        ("/runs/{run}/decisions?source=oracle", 400, "source: Input should be 'llm', 'rule'"),
        ("/runs/{run}/decisions?epoch=x", 400, "epoch: Input should be a valid integer"),
        ("/runs/{run}/decisions/planner/7", 404, "has no planner decision at slot 7"),
        ("/runs/{run}/cluster?epoch=99", 404, "has no macro policy for epoch 99"),
        ("/reports?show=nope", 404, "no report 'nope'"),
    ],
    ids=[
        "unknown-run",
        "bad-window",
        "bad-source",
        "bad-epoch",
        "no-decision",
        "no-epoch",
        "no-report",
    ],
)
def test_bad_input_is_a_clear_page(
    page: Any,
    dashboard: Dashboard,
    filled_store: FilledStore,
    path: str,
    status: int,
    message: str,
) -> None:
    response = page.goto(dashboard.url + path.format(run=filled_store.run))
    assert response.status == status
    text = page.locator("#error-message").inner_text()
    assert message in text
    assert "Traceback" not in page.content()


def test_reports_side_by_side(page: Any, dashboard: Dashboard, reports_root: Path) -> None:
    page.goto(f"{dashboard.url}/reports")
    sections = page.locator("section[data-report]")
    assert sections.count() == 2
    for i in range(2):
        section = sections.nth(i)
        name = section.get_attribute("data-report")
        policy = "ma" if name.endswith("-ma") else "rr"
        payload = json.loads((reports_root.parent / name / "summary.json").read_text())
        objective = payload["scenarios"]["testbed"][policy]["objective"]
        assert section.locator(f'tr[data-policy="{policy}"] td.objective').inner_text() == (
            f"{objective:.3f}"
        )
        images = section.locator("img")
        assert images.count() >= 3  # Fig. 6, 7 and 9
        # every figure actually loads (served by the dashboard, offline); they are
        # lazy, so each is brought into view and waited for (a timeout fails the test)
        for j in range(images.count()):
            image = images.nth(j)
            image.scroll_into_view_if_needed()
            page.wait_for_function(
                "i => i.complete && i.naturalWidth > 0", arg=image.element_handle()
            )
    screenshot(page, "reports")


@pytest.fixture
def live_run(filled_store: FilledStore) -> Iterator[str]:
    """A run in progress: registered, deciding now, with requests arriving."""
    run = f"live-{datetime.now(UTC):%H%M%S%f}"
    with open_store(str(filled_store.path)) as store:
        store.record_run(RunInfo(id=run, scenario="testbed", policy="ma", backend="kubernetes"))
        store.record_decision(_placement(run, 0))
        store.record_requests(_requests(run, 0, 40))
    yield run


def _placement(run: str, slot: int) -> Decision[Placement]:
    return Decision[Placement](
        agent="deployer",
        policy="agentic",
        source="rule",
        run=run,
        slot=slot,
        node="worker-1",
        value=Placement(
            node="worker-1", lms=[LMPlacement(lm="lm1", mode="gpu", cpu_cores=2, vgpus=1)]
        ),
    )


def _requests(run: str, first: int, count: int) -> list[RequestRecord]:
    return [
        RequestRecord(
            id=f"q{i}",
            run=run,
            lm="lm1",
            origin="worker-1",
            destination="worker-1",
            prompts=1,
            slot=i // 20,
            submit_s=30.0 * (i // 20),
            queue_s=1.0,
            inference_s=2.0,
            outcome="success",
        )
        for i in range(first, first + count)
    ]


@pytest.fixture
def live_dashboard(filled_store: FilledStore) -> Iterator[Dashboard]:
    """A dashboard with the default live window (120 s), reloading live pages every second."""
    server = Dashboard(filled_store.path)
    yield server
    server.stop()


def test_a_live_run_updates_in_place(
    page: Any, live_dashboard: Dashboard, filled_store: FilledStore, live_run: str
) -> None:
    page.goto(f"{live_dashboard.url}/runs/{live_run}")
    assert page.locator("h1 .live").inner_text() == "live"
    assert card(page, "requests") == "40"
    with open_store(str(filled_store.path)) as store:  # the controller writes on
        store.record_requests(_requests(live_run, 40, 25))
        store.record_decision(_placement(live_run, 1))
    deadline = time.monotonic() + 60
    while card(page, "requests") != "65" and time.monotonic() < deadline:
        page.wait_for_timeout(500)  # the page reloads itself every second (--refresh 1)
    assert card(page, "requests") == "65"


def test_a_token_protected_dashboard_asks_for_the_token(
    page: Any, filled_store: FilledStore, tmp_path: Path
) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret-user-token\n")
    server = Dashboard(filled_store.path, "--token-file", str(token))
    try:
        target = f"{server.url}/runs/{quote(filled_store.run)}"
        page.goto(target)
        assert "/login" in page.url
        page.fill('input[name="token"]', "wrong")
        page.click('button[type="submit"]')
        assert page.locator("#error-message").inner_text() == "wrong token"
        page.fill('input[name="token"]', "s3cret-user-token")
        page.click('button[type="submit"]')
        page.wait_for_url(target)
        assert page.locator("h1").inner_text().startswith(filled_store.run)
    finally:
        server.stop()
