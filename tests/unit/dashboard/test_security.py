"""What the dashboard refuses to do for a page or a report folder it is shown.

The real app over a real (embedded) store and real report folders: headers
on every response, a login cookie that is not the token, report figures
that are regular files of their folder only, SVGs that cannot run a script
on this origin, and one broken report that does not take the page down.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from lmedge.dashboard.app import COOKIE, SECURITY_HEADERS, DashboardSettings, create_app
from lmedge.dashboard.sessions import Sessions
from lmedge.store import RunInfo, open_store
from tests.unit.dashboard.test_views import ROW

TOKEN = "users-api-token-0123456789"
SVG = b'<svg xmlns="http://www.w3.org/2000/svg"><script>alert(document.cookie)</script></svg>'


def _folder(root: Path, name: str, rows: dict[str, object]) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps({"runs": [], "scenarios": {"tb": rows}}))
    return folder


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("r") / "reports"
    good = _folder(root, "good", {"ma": ROW})
    (good / "fig6.svg").write_bytes(SVG)
    (good / "fig7.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    secret = root.parent / "hostname.png"
    secret.write_bytes(b"not a figure of this report")
    (good / "leak.png").symlink_to(secret)
    missing = {k: v for k, v in ROW.items() if k != "success_ratio"}
    _folder(root, "partial", {"ma": missing})
    return root


@pytest.fixture(scope="module")
def store_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    db = str(tmp_path_factory.mktemp("store") / "db")
    with open_store(db) as store:
        store.record_run(RunInfo(id="r", scenario="testbed", policy="MA"))
        store.flush()
    return db


def _client(store_path: str, reports: Path, **settings: object) -> Iterator[TestClient]:
    cfg = DashboardSettings(report_roots=(reports,), **settings)  # type: ignore[arg-type]
    with open_store(store_path, read_only=True) as store, TestClient(create_app(store, cfg)) as c:
        yield c


@pytest.fixture(scope="module")
def open_client(store_path: str, reports: Path) -> Iterator[TestClient]:
    yield from _client(store_path, reports)


@pytest.fixture(scope="module")
def guarded(store_path: str, reports: Path) -> Iterator[TestClient]:
    yield from _client(store_path, reports, token=TOKEN)


def test_a_report_missing_a_field_is_shown_unreadable_and_the_others_as_usual(
    open_client: TestClient,
) -> None:
    page = open_client.get(
        "/reports", params=[("show", "reports/good"), ("show", "reports/partial")]
    )
    assert page.status_code == 200
    assert "data-unreadable" in page.text and "&#39;success_ratio&#39; is missing" in page.text
    assert page.text.count('<tr data-policy="ma"') == 1  # the good report's row


def test_only_regular_files_of_the_report_are_figures(open_client: TestClient) -> None:
    page = open_client.get("/reports", params={"show": "reports/good"})
    assert "figures/fig6.svg" in page.text and "leak.png" not in page.text
    for name in ("leak.png", "..%2Fhostname.png", "..%2F..%2Fhostname.png", "summary.json"):
        assert open_client.get(f"/reports/reports/good/figures/{name}").status_code == 404, name
    png = open_client.get("/reports/reports/good/figures/fig7.png")
    assert png.status_code == 200 and png.headers["content-type"] == "image/png"


def test_an_svg_figure_is_an_image_that_cannot_script_this_origin(open_client: TestClient) -> None:
    svg = open_client.get("/reports/reports/good/figures/fig6.svg")
    assert svg.status_code == 200 and svg.content == SVG
    assert svg.headers["content-type"].startswith("image/svg+xml")
    assert svg.headers["content-disposition"].startswith("attachment")
    assert "sandbox" in svg.headers["content-security-policy"]
    assert "script-src" not in svg.headers["content-security-policy"]


@pytest.mark.parametrize(
    ("path", "status"),
    [
        ("/", 200),
        ("/healthz", 200),
        ("/login", 200),
        ("/runs/nope", 404),
        ("/runs/r?window=0", 400),
        ("/reports", 200),
    ],
    ids=["runs", "healthz", "login", "not-found", "bad-query", "reports"],
)
def test_every_response_carries_the_security_headers(
    open_client: TestClient, path: str, status: int
) -> None:
    response = open_client.get(path)
    assert response.status_code == status
    for name, value in SECURITY_HEADERS.items():
        assert response.headers[name] == value, name
    assert "frame-ancestors 'none'" in response.headers["content-security-policy"]


def test_the_sign_in_redirect_carries_the_security_headers_too(guarded: TestClient) -> None:
    response = guarded.get("/", follow_redirects=False)
    assert response.status_code == 303
    assert response.headers["x-frame-options"] == "DENY"


def test_the_login_cookie_is_a_signed_session_not_the_token(guarded: TestClient) -> None:
    login = guarded.post(
        "/login",
        content=f"token={TOKEN}&next=/",
        headers={"content-type": "application/x-www-form-urlencoded"},
        follow_redirects=False,
    )
    assert login.status_code == 303
    value = login.cookies[COOKIE]
    assert TOKEN not in value and TOKEN not in login.headers["set-cookie"]
    guarded.cookies.clear()
    guarded.cookies.set(COOKIE, value)
    assert guarded.get("/").status_code == 200
    # the token itself, or a session signed by another process, opens nothing
    forged = Sessions(TOKEN).issue()
    for bad in (TOKEN, forged, value + "0"):
        guarded.cookies.clear()
        guarded.cookies.set(COOKIE, bad)
        assert guarded.get("/", follow_redirects=False).status_code == 303
    guarded.cookies.clear()


@pytest.mark.parametrize(
    ("age_s", "valid"), [(0, True), (3600, True), (13 * 3600, False), (-60, False)],
    ids=["fresh", "an-hour", "expired", "from-the-future"],
)  # fmt: skip
def test_a_session_lasts_its_ttl(age_s: float, valid: bool) -> None:
    now = [1_000_000.0]
    sessions = Sessions(TOKEN, b"k" * 32, clock=lambda: now[0])
    value = sessions.issue()
    now[0] += age_s
    assert sessions.valid(value) is valid
    # bound to the token: the same secret with another token refuses it
    assert not Sessions("other-token", b"k" * 32, clock=lambda: now[0]).valid(value)
