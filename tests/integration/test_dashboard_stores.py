"""The dashboard over FerretDB (MongoDB wire protocol) and over the embedded
store shows the same pages for the same simulation.

Both stores are filled by the real `lmedge simulate --store` with one seed;
the pages are the dashboard app's, read over HTTP (Starlette's test client).
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from lmedge.dashboard import create_app
from lmedge.store import open_store
from tests.e2e.cli import cli

SLOTS = 20


def _cards(page: str) -> dict[str, str]:
    """The headline numbers of a run page, by metric."""
    found = re.findall(
        r'data-metric="([a-z0-9_]+)"><div class="label">.*?</div><div class="value">(.*?)</div>',
        page,
    )
    return {k: html.unescape(v) for k, v in found}


def _client(uri: str) -> Iterator[TestClient]:
    store = open_store(uri, read_only=True)
    try:
        with TestClient(create_app(store)) as client:
            yield client
    finally:
        store.close()


def _simulate(uri: str, capsys: pytest.CaptureFixture[str]) -> str:
    code, out, err = cli(
        ["simulate", "--slots", str(SLOTS), "--seed", "5", "--store", uri, "--no-settle"], capsys
    )
    assert code == 0, err
    match = re.search(r"run (\S+) stored in", out)
    assert match, out
    return match.group(1)


@pytest.mark.ferretdb
def test_ferretdb_and_embedded_stores_show_the_same_run(
    ferretdb_uri: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pages: dict[str, dict[str, str]] = {}
    for name, uri in (("mongodb", ferretdb_uri), ("embedded", str(tmp_path / "db"))):
        run = _simulate(uri, capsys)
        for client in _client(uri):
            listing = client.get("/")
            assert listing.status_code == 200 and run in listing.text
            page = client.get(f"/runs/{run}")
            assert page.status_code == 200
            pages[name] = _cards(page.text)
            cluster = client.get(f"/runs/{run}/cluster")
            assert cluster.status_code == 200 and 'id="chart-policy"' in cluster.text
            decisions = client.get(f"/runs/{run}/decisions", params={"agent": "planner"})
            assert decisions.status_code == 200
            assert decisions.text.count('<tr data-agent="planner"') >= 1
            missing = client.get("/runs/not-a-run")
            assert missing.status_code == 404 and "no run &#39;not-a-run&#39;" in missing.text
    # the run cards: J, Jain, success, latencies (served, at tau, P99), energy, ...
    # (a pipeline run measures no tokens, KV balance or routing windows: no cards)
    assert len(pages["mongodb"]) == 11
    assert pages["mongodb"] == pages["embedded"]
