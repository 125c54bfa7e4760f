"""The dashboard's web app: server-rendered pages over one read-only store.

Pages are HTML from Jinja2 templates with inline SVG charts
(`lmedge.dashboard.charts`): no script, no stylesheet or font from anywhere
else, so it works offline and through `kubectl port-forward`. A page of a
live run reloads itself (`<meta http-equiv="refresh">`) every
`DashboardSettings.refresh_s` seconds.

Errors are pages, never tracebacks: an unknown run, decision or report is a
404 page naming what exists, a malformed query parameter a 400 page naming
the parameter, a store that does not answer a 503 page.

Access: with a user token (`DashboardSettings.token`, the same token the
gateways' user API takes) every page needs it, as `Authorization: Bearer`, or
the signed session cookie the `/login` form sets (`lmedge.dashboard.sessions`:
never the token itself); without one, every page is open (the CLI allows that
on a loopback address only).

Every response carries `SECURITY_HEADERS`: a Content-Security-Policy that
allows nothing but the page's own inline styles and same-site images, no
framing, no content sniffing. Report figures are served only when they are
regular files inside their report folder; an SVG is served as an attachment
under a sandboxing policy, so a script inside it never runs on this origin.
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Final, Literal
from urllib.parse import parse_qs, parse_qsl, urlencode

from fastapi import FastAPI, Query, Request
from fastapi import Path as PathParam
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from jinja2 import Environment, PackageLoader, select_autoescape
from markupsafe import Markup
from starlette.exceptions import HTTPException

import lmedge
from lmedge.dashboard import charts, views
from lmedge.dashboard.sessions import SESSION_TTL_S, Sessions
from lmedge.errors import StoreError, StoreUnavailable
from lmedge.store import Store
from lmedge.tokens import bearer_token, same_token

__all__ = ["COOKIE", "SECURITY_HEADERS", "DashboardSettings", "create_app"]

#: The cookie holding the signed session after `/login` (never the token).
COOKIE: Final = "lmedge_session"
#: Set on every response. The pages need nothing but their inline `<style>`
#: and `style` attributes, images from this site (report figures) and forms
#: posting here; nothing may frame them.
SECURITY_HEADERS: Final = {
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'unsafe-inline'; img-src 'self'; "
        "form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
}
#: What a report SVG opened on its own may do: nothing (no script, no fetch).
_FIGURE_POLICY: Final = "default-src 'none'; style-src 'unsafe-inline'; sandbox"
Agent = Literal["planner", "scheduler", "deployer"]
SourceName = Literal["llm", "rule", "fallback"]
OutcomeName = Literal["accepted", "replaced"]
#: A scheduler decision's kind: a gateway's routing `window` or a `slot` map.
KindName = Literal["window", "slot"]


@dataclass(frozen=True)
class DashboardSettings:
    """How the dashboard serves its store."""

    #: The user token every page requires; None: open (loopback only, see the CLI).
    token: str | None = None
    #: Reload period of a live run's pages, seconds.
    refresh_s: int = 5
    #: A run is live while its newest decision is younger than this, seconds
    #: (a cluster run decides every 30 s slot; 120 s tolerates a slow epoch).
    live_window_s: float = 120.0
    #: Folders searched for report folders (`summary.json` and figures).
    report_roots: tuple[Path, ...] = field(default_factory=lambda: (Path("reports"),))
    #: Shown in the page header: where the data comes from.
    store_label: str = ""
    #: HMAC key of the login cookies; None: random per process (a restart ends
    #: every login). Give one to replicas behind one Service.
    session_secret: bytes | None = None


def _templates() -> Environment:
    env = Environment(
        loader=PackageLoader("lmedge.dashboard", "templates"),
        autoescape=select_autoescape(["html"]),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["num"] = _num
    env.filters["pct"] = _pct
    env.globals["version"] = lmedge.__version__
    env.globals["source_colours"] = charts.SOURCE_COLOURS
    return env


def _num(value: Any, digits: int = 3) -> str:
    if value is None:
        return "–"
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _pct(value: Any) -> str:
    return "–" if value is None else f"{100 * float(value):.1f}%"


def create_app(store: Store, settings: DashboardSettings | None = None) -> FastAPI:
    """The dashboard over `store` (opened read-only by the caller, closed by it too)."""
    cfg = settings or DashboardSettings()
    env = _templates()
    app = FastAPI(title="lmedge dashboard", docs_url=None, redoc_url=None, openapi_url=None)
    # One reader at a time: the embedded backend (SQLite) must not be shared
    # across threads. Held only while a page reads its snapshot, never while it
    # computes on it (`views.read_run` then `views.run_state`).
    lock = threading.Lock()
    sessions = Sessions(cfg.token, cfg.session_secret) if cfg.token is not None else None

    @contextmanager
    def reading() -> Iterator[Store]:
        with lock:
            yield store

    def page(
        request: Request, template: str, status: int = 200, live: bool = False, **ctx: Any
    ) -> HTMLResponse:
        html = env.get_template(template).render(
            request=request,
            store_label=cfg.store_label or store.where,
            refresh_s=cfg.refresh_s if live else None,
            auth=cfg.token is not None,
            **ctx,
        )
        return HTMLResponse(html, status_code=status)

    def error(request: Request, status: int, message: str) -> HTMLResponse:
        titles = {400: "Bad request", 401: "Sign in", 404: "Not found", 503: "Store unavailable"}
        return page(
            request, "error.html", status, title=titles.get(status, "Error"), message=message
        )

    @app.exception_handler(views.NotFound)
    async def _not_found(request: Request, exc: views.NotFound) -> HTMLResponse:
        return error(request, 404, str(exc))

    @app.exception_handler(views.BadQuery)
    async def _out_of_range(request: Request, exc: views.BadQuery) -> HTMLResponse:
        return error(request, 400, str(exc))

    @app.exception_handler(StoreUnavailable)
    async def _unavailable(request: Request, exc: StoreUnavailable) -> HTMLResponse:
        return error(request, 503, str(exc))

    @app.exception_handler(StoreError)
    async def _store_error(request: Request, exc: StoreError) -> HTMLResponse:
        # An empty store, or a run without requests: nothing to show, said plainly.
        return error(request, 404, str(exc))

    @app.exception_handler(RequestValidationError)
    async def _bad_query(request: Request, exc: RequestValidationError) -> HTMLResponse:
        problems = []
        for e in exc.errors():
            where = ".".join(str(p) for p in e.get("loc", ())[1:]) or "request"
            given = e.get("input")
            shown = f" (got {given!r})" if isinstance(given, str | int | float) else ""
            problems.append(f"{where}: {e.get('msg', 'invalid')}{shown}")
        return error(request, 400, "; ".join(problems))

    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: HTTPException) -> Response:
        if exc.status_code == 401:
            return RedirectResponse(f"/login?{urlencode({'next': request.url.path})}", 303)
        return error(request, exc.status_code, str(exc.detail))

    @app.middleware("http")
    async def _drop_empty_fields(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        # A filter form submits its empty fields as `name=`; empty means "any".
        query = request.scope.get("query_string", b"")
        if query:
            kept = [(k, v) for k, v in parse_qsl(query.decode("latin-1")) if v != ""]
            request.scope["query_string"] = urlencode(kept).encode("latin-1")
        return await call_next(request)

    @app.middleware("http")
    async def _guard(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        if cfg.token is None or sessions is None or request.url.path in ("/login", "/healthz"):
            return await call_next(request)
        given = bearer_token(request.headers.get("authorization"))
        if given is not None and same_token(given, cfg.token):
            return await call_next(request)
        cookie = request.cookies.get(COOKIE)
        if given is None and cookie is not None and sessions.valid(cookie):
            return await call_next(request)
        if request.headers.get("authorization"):
            return error(request, 401, "wrong bearer token")
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        return RedirectResponse(f"/login?{urlencode({'next': target})}", 303)

    @app.middleware("http")
    async def _security_headers(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        # Added last, so outermost: it sees the guard's redirects and 401s too.
        response = await call_next(request)
        for name, value in SECURITY_HEADERS.items():
            response.headers.setdefault(name, value)
        return response

    @app.get("/healthz", include_in_schema=False)
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/login", response_class=HTMLResponse)
    def login_form(request: Request, next: str = "/", failed: bool = False) -> HTMLResponse:
        return page(request, "login.html", 401 if failed else 200, next=_local(next), failed=failed)

    @app.post("/login")
    async def login(request: Request) -> Response:
        form = parse_qs((await request.body()).decode("utf-8", "replace"))
        token = (form.get("token") or [""])[0].strip()
        target = _local((form.get("next") or ["/"])[0])
        if cfg.token is None or sessions is None or not same_token(token, cfg.token):
            return page(request, "login.html", 401, next=target, failed=True)
        response = RedirectResponse(target, 303)
        response.set_cookie(
            COOKIE,
            sessions.issue(),
            max_age=int(SESSION_TTL_S),
            httponly=True,
            samesite="strict",
        )
        return response

    @app.get("/", response_class=HTMLResponse)
    def runs_page(request: Request) -> HTMLResponse:
        with reading() as db:
            rows = views.run_rows(db, cfg.live_window_s)
        return page(request, "runs.html", live=any(r.live for r in rows), rows=rows)

    @app.get("/runs/{run_id}", response_class=HTMLResponse)
    def run_page(
        request: Request,
        run_id: str,
        window: Annotated[int, Query(ge=1, le=10_000, description="Slots per window.")] = 10,
        start: Annotated[int, Query(ge=0, description="First slot counted.")] = 0,
        end: Annotated[int | None, Query(ge=1, description="First slot not counted.")] = None,
    ) -> HTMLResponse:
        if end is not None and end <= start:
            return error(request, 400, f"end ({end}) must be after start ({start})")
        with reading() as db:
            data = views.read_run(db, run_id)
        state = views.run_state(data, window, cfg.live_window_s, start, end)
        starts = [float(w["start_slot"]) for w in state.windows]

        def series(key: str) -> list[tuple[float, float | None]]:
            return list(zip(starts, [w[key] for w in state.windows], strict=True))

        x_label = f"window start (slot; {window} slots per window)"
        figures = {
            "success": charts.LineChart(
                "Success ratio per LM, per window (paper Fig. 6)",
                x_label,
                "success ratio",
                [
                    charts.Series(lm, list(zip(starts, vals, strict=True)))
                    for lm, vals in state.lm_success.items()
                ],
                y_min=0.0,
                y_max=1.0,
                chart_id="chart-success",
            ),
            "latency": charts.LineChart(
                "Mean latency per LM, per window (paper Fig. 7)",
                x_label,
                "latency (s)",
                [
                    charts.Series(lm, list(zip(starts, vals, strict=True)))
                    for lm, vals in state.lm_latency.items()
                ],
                reference=(state.constants.tau_s, f"τ = {state.constants.tau_s:g} s"),
                chart_id="chart-latency",
            ),
            "objective": charts.LineChart(
                "Objective J and Jain's index per window (paper Fig. 9)",
                x_label,
                "value (J lower is better)",
                [
                    charts.Series("objective J", series("objective")),
                    charts.Series("Jain", series("jain")),
                ],
                y_min=0.0,
                y_max=1.0,
                chart_id="chart-objective",
            ),
            "ratios": charts.LineChart(
                "Rejected and conflict ratios per window",
                x_label,
                "share of requests",
                [
                    charts.Series("rejected", series("rejected_ratio")),
                    charts.Series("conflict (cross-node)", series("conflict_ratio")),
                ],
                y_min=0.0,
                chart_id="chart-ratios",
            ),
        }
        routing = state.routing
        if routing is not None and routing.per_slot:
            figures["windows"] = charts.LineChart(
                "Routing windows: J and the load-aware seed's J, mean per slot",
                "slot",
                "J (lower is better)",
                [
                    charts.Series("J", [(float(t), j) for t, j, _ in routing.per_slot]),
                    charts.Series("seed J", [(float(t), sj) for t, _, sj in routing.per_slot]),
                ],
                y_min=0.0,
                chart_id="chart-windows",
            )
        return page(
            request,
            "run.html",
            live=state.live,
            state=state,
            figures={k: Markup(v.svg()) for k, v in figures.items()},
        )

    @app.get("/runs/{run_id}/cluster", response_class=HTMLResponse)
    def cluster_page(
        request: Request,
        run_id: str,
        epoch: Annotated[int | None, Query(ge=0, description="Macro policy of this epoch.")] = None,
    ) -> HTMLResponse:
        with reading() as db:
            data = views.read_cluster(db, run_id)
        cs = views.cluster_state(data, epoch)
        latest = data.latest_decision
        every = max(1, len(cs.slots) // 20)
        active = charts.Heatmap(
            "Active LMs per node over slots",
            cs.nodes,
            [str(s) for s in cs.slots],
            {(n, str(s)): float(len(v)) for (n, s), v in cs.active.items()},
            "slot",
            "node",
            unit=" LMs",
            chart_id="chart-active",
            column_label_every=every,
        )
        backlog = charts.Heatmap(
            "Queue backlog per node over slots (largest in the slot)",
            cs.nodes,
            [str(s) for s in cs.backlog_slots],
            {(n, str(s)): v for (n, s), v in cs.backlog.items()},
            "slot",
            "node",
            unit=" prompts",
            chart_id="chart-backlog",
            column_label_every=max(1, len(cs.backlog_slots) // 20),
        )
        kv = charts.Heatmap(
            "KV-cache usage per node over slots (fullest token-engine pod in the slot)",
            cs.nodes,
            [str(s) for s in cs.kv_slots],
            {(n, str(s)): v for (n, s), v in cs.kv_usage.items()},
            "slot",
            "node",
            v_max=1.0,
            chart_id="chart-kv",
            column_label_every=max(1, len(cs.kv_slots) // 20),
        )
        policy = charts.Heatmap(
            f"Macro policy of epoch {cs.policy_epoch}: routing weight, ● = role (hosts the LM)",
            cs.policy_lms,
            cs.policy_nodes,
            {k: v for k, v in cs.policy_weights.items()},
            "node",
            "LM",
            v_max=1.0,
            marks={k: "●" for k in cs.policy_roles},
            chart_id="chart-policy",
        )
        return page(
            request,
            "cluster.html",
            live=views.is_live(latest, cfg.live_window_s),
            cs=cs,
            figures={
                "active": Markup(active.svg()),
                "backlog": Markup(backlog.svg()),
                # only where a node runs a token engine: pipeline runs keep their page
                "kv": Markup(kv.svg()) if cs.kv_usage else None,
                "policy": Markup(policy.svg()),
            },
        )

    @app.get("/runs/{run_id}/decisions", response_class=HTMLResponse)
    def decisions_page(
        request: Request,
        run_id: str,
        agent: Annotated[Agent | None, Query()] = None,
        node: Annotated[str | None, Query(min_length=1, max_length=253)] = None,
        epoch: Annotated[int | None, Query(ge=0)] = None,
        slot: Annotated[int | None, Query(ge=0)] = None,
        source: Annotated[SourceName | None, Query()] = None,
        outcome: Annotated[OutcomeName | None, Query()] = None,
        flagged: Annotated[bool, Query()] = False,
        limit: Annotated[int, Query(ge=1, le=views.MAX_DECISIONS)] = 200,
        kind: Annotated[KindName | None, Query()] = None,
    ) -> HTMLResponse:
        f = views.DecisionFilter(agent, node, epoch, slot, source, outcome, flagged, limit, kind)
        with reading() as db:
            info = views.find_run(db, run_id)
            newest = db.decisions(run=run_id, limit=1)
            # Filters past the run's newest decision select nothing: refused, naming the bound.
            views.check_decision_filter(run_id, newest[0] if newest else None, f)
            found = views.decisions(db, run_id, f)
            latest = views.latest_decision_time(db, run_id)
        base = f"/runs/{run_id}/"
        timeline = charts.Timeline(
            "Decisions over slots (filled: accepted, hollow: replaced)",
            list(views.LANES),
            [
                charts.Mark(
                    x=d.slot,
                    lane=views.lane(d),
                    colour=charts.SOURCE_COLOURS.get(d.source, "#888"),
                    hollow=d.outcome != "accepted",
                    tip=f"{views.lane(d)} slot {d.slot}{' ' + d.node if d.node else ''}: "
                    f"{d.source}, {d.outcome}, {len(d.violations)} violations",
                    href=base + views.decision_key(d),
                )
                for d in found
            ],
            "slot",
            legend=charts.SOURCE_COLOURS,
            chart_id="chart-decisions",
        )
        return page(
            request,
            "decisions.html",
            live=views.is_live(latest, cfg.live_window_s),
            info=info,
            found=found,
            f=f,
            base=base,
            key=views.decision_key,
            lane=views.lane,
            timeline=Markup(timeline.svg()),
        )

    @app.get("/runs/{run_id}/decisions/{agent}/{slot}", response_class=HTMLResponse)
    def decision_page(
        request: Request,
        run_id: str,
        agent: Agent,
        slot: Annotated[int, PathParam(ge=0)],
        node: Annotated[str | None, Query(min_length=1, max_length=253)] = None,
        window_start: Annotated[
            float | None, Query(ge=0, description="A routing window's start, run seconds.")
        ] = None,
    ) -> HTMLResponse:
        with reading() as db:
            info = views.find_run(db, run_id)
            d = views.decision(db, run_id, agent, slot, node, window_start)
            seen = views.telemetry_seen(db, d, views.constants(info).slot_s)
        return page(
            request,
            "decision.html",
            info=info,
            d=d,
            seen=seen,
            value_json=d.value.model_dump_json(indent=2),
        )

    @app.get("/reports", response_class=HTMLResponse)
    def reports_page(
        request: Request, show: Annotated[list[str] | None, Query(max_length=8)] = None
    ) -> HTMLResponse:
        folders = views.find_reports(cfg.report_roots)
        chosen = show if show else list(folders)[:2]
        # An unreadable report is shown as such (its `problem`); the others as usual.
        shown = [views.load_report(name, folders) for name in chosen]
        return page(
            request,
            "reports.html",
            folders=folders,
            shown=shown,
            roots=cfg.report_roots,
            urlencode=urlencode,
        )

    @app.get("/reports/{name:path}/figures/{filename}")
    def report_figure(name: str, filename: str) -> Response:
        folders = views.find_reports(cfg.report_roots)
        report = views.load_report(name, folders)
        content = views.read_figure(report, filename)
        if filename.endswith(".svg"):
            # Shown by <img> (which runs no script); opened on its own it downloads,
            # and the sandbox policy stops a script even where a browser renders it.
            return Response(
                content,
                media_type="image/svg+xml",
                headers={
                    "Content-Disposition": f'attachment; filename="{filename}"',
                    "Content-Security-Policy": _FIGURE_POLICY,
                },
            )
        return Response(content, media_type="image/png")

    return app


def _local(target: str) -> str:
    """`target` when it is a path on this site, else `/` (no open redirect after login)."""
    return target if target.startswith("/") and not target.startswith("//") else "/"
