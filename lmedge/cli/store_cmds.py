"""`lmedge decisions` and `lmedge status`: read what the control plane stored.

Both open the store read-only (`--store`, else `$LMEDGE_STORE`, else
`./.lmedge/store`) and never create anything: a wrong path is an error, not a
new empty store. A malformed URI, an unreachable server, an empty store or an
unknown run is one line on stderr and a non-zero exit (`lmedge.cli.main`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from enum import StrEnum
from typing import Annotated, Any

import typer
from rich import box
from rich.console import Console
from rich.table import Table

from lmedge.api.decisions import WINDOW_TRIGGER, MacroPolicy, Placement, RoutingMap
from lmedge.errors import ConfigError
from lmedge.metrics import LAMBDA, TAU_S, fairness, objective
from lmedge.store import AnyDecision, Store, open_store

StoreOption = Annotated[
    str | None,
    typer.Option(
        "--store",
        help="Store URI or folder (default: $LMEDGE_STORE, else ./.lmedge/store).",
        show_default=False,
    ),
]
#: The widest a `--wide` table grows, columns.
MAX_WIDE = 400
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


class AgentName(StrEnum):
    planner = "planner"
    scheduler = "scheduler"
    deployer = "deployer"


class SourceName(StrEnum):
    llm = "llm"
    rule = "rule"
    fallback = "fallback"


class OutcomeName(StrEnum):
    accepted = "accepted"
    replaced = "replaced"


@contextmanager
def _reading(uri: str | None) -> Iterator[Store]:
    store = open_store(uri, read_only=True)
    try:
        yield store
    finally:
        store.close()


def summarize(decision: AnyDecision) -> str:
    """The decided value in a few words, for one table cell."""
    value = decision.value
    if isinstance(value, MacroPolicy):
        hosted = sum(len(r.lms) for r in value.roles)
        return f"{len(value.routing)} LMs routed, {hosted} LM roles on {len(value.roles)} nodes"
    if isinstance(value, RoutingMap):
        remote = sum(r.origin != r.destination for r in value.routes)
        text = f"{len(value.routes)} routes, {remote} to another node"
        return text + (f", {len(value.rejections)} rejected" if value.rejections else "")
    if isinstance(value, Placement):
        parts = [
            f"{p.lm}:{p.mode}({p.cpu_cores:g}c" + (f",{p.vgpus}v)" if p.vgpus else ")")
            for p in value.lms
            if p.mode != "off"
        ]
        return " ".join(parts) or "all off"
    return type(value).__name__  # pragma: no cover - the union is exhaustive


def reason(decision: AnyDecision, every: bool = False) -> str:
    """Why a decision is not plainly accepted: its error, else its violations ("" if none).

    The first violation and how many more, unless `every`.
    """
    if decision.error:
        return decision.error
    if decision.violations:
        if every or len(decision.violations) == 1:
            return "; ".join(decision.violations)
        return f"{decision.violations[0]} (+{len(decision.violations) - 1} more)"
    if not decision.parsed:
        return "reply not parsed"
    return ""


def _decisions_table(found: list[AnyDecision], *, wide: bool, full_ids: bool) -> Table:
    """The decisions, readable at 80 columns unless `wide`.

    Run ids are long (scenario, profile, seed, timestamp) and must stay
    pasteable into `--run`: a single run is named once in the title; several
    get a short key ([1], [2]) explained above the table, or their full id
    in a column with `full_ids`.
    """
    runs = list(dict.fromkeys(d.run or "-" for d in found))
    keys = {run: f"[{i}]" for i, run in enumerate(runs, 1)}
    title = f"{len(found)} latest decisions"
    if len(runs) == 1:
        title += f" of run {runs[0]}"
    elif not full_ids:
        title += f" of {len(runs)} runs:" + "".join(f"\n{keys[r]} {r}" for r in runs)
    table = Table(
        title=title,
        title_justify="left",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        padding=(0, 1),
        collapse_padding=True,
    )
    if wide:
        table.add_column("created", no_wrap=True)
    if len(runs) > 1 or full_ids:
        table.add_column("run", no_wrap=True)
    table.add_column("agent", no_wrap=True)
    table.add_column("epoch", justify="right", no_wrap=True)
    table.add_column("slot", justify="right", no_wrap=True)
    table.add_column("node", no_wrap=True)
    if wide:
        table.add_column("policy", no_wrap=True)
    table.add_column("source", no_wrap=True)
    table.add_column("outcome", no_wrap=True)
    table.add_column("s", justify="right", no_wrap=True)
    if wide:
        table.add_column("tokens", justify="right", no_wrap=True)
    table.add_column("reason", overflow="fold", ratio=1, min_width=12)
    if wide:
        table.add_column("value", overflow="fold")
    for d in found:
        row: list[str] = []
        if wide:
            row.append(d.created_at.strftime("%Y-%m-%d %H:%M:%S"))
        if len(runs) > 1 or full_ids:
            row.append((d.run or "-") if full_ids else keys[d.run or "-"])
        agent = f"{d.agent} (window)" if d.trigger == WINDOW_TRIGGER else d.agent
        row += [agent, str(d.epoch), str(d.slot), d.node or "-"]
        if wide:
            row.append(d.policy)
        row += [d.source, d.outcome, f"{d.latency_s:.2f}"]
        if wide:
            row.append(f"{d.tokens_in}/{d.tokens_out}")
        row.append(reason(d, every=wide))
        if wide:
            row.append(summarize(d))
        table.add_row(*row, style="red" if d.outcome != "accepted" else None)
    return table


def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def register(app: typer.Typer) -> None:
    @app.command("decisions")
    def decisions(
        agent: Annotated[
            AgentName | None, typer.Option("--agent", "-a", help="Only this agent's decisions.")
        ] = None,
        run: Annotated[str | None, typer.Option(help="Only this run.")] = None,
        epoch: Annotated[int | None, typer.Option(min=0, help="Only this epoch.")] = None,
        slot: Annotated[int | None, typer.Option(min=0, help="Only this slot.")] = None,
        node: Annotated[str | None, typer.Option(help="Only this node's decisions.")] = None,
        source: Annotated[
            SourceName | None, typer.Option(help="Only decisions from this source.")
        ] = None,
        outcome: Annotated[
            OutcomeName | None, typer.Option(help="Only accepted, or only replaced, decisions.")
        ] = None,
        windows: Annotated[
            bool | None,
            typer.Option(
                "--windows/--no-windows",
                help="Only a gateway's routing windows (stored with the scheduler's "
                "decisions), or none of them; both when not given.",
            ),
        ] = None,
        limit: Annotated[int, typer.Option("--limit", "-n", min=1, help="At most this many.")] = 20,
        wide: Annotated[
            bool,
            typer.Option(
                "--wide", "-w", help="Add the time, policy, tokens, every violation and the value."
            ),
        ] = False,
        full_ids: Annotated[
            bool, typer.Option("--full-ids", help="Show each decision's full run id in a column.")
        ] = False,
        as_json: JsonOption = False,
        store: StoreOption = None,
    ) -> None:
        """The latest agent decisions, newest first, with why any was replaced."""
        with _reading(store) as db:
            found = db.decisions(
                agent=agent.value if agent else None,
                run=run,
                epoch=epoch,
                slot=slot,
                node=node,
                source=source.value if source else None,
                outcome=outcome.value if outcome else None,
                windows=windows,
                limit=limit,
            )
            if not found:
                db.status()  # an empty store raises its own, clearer error
                raise ConfigError(f"no decisions in {db.where} match the filters")
        if as_json:
            typer.echo(json.dumps([d.model_dump(mode="json") for d in found], indent=2))
        else:
            table = _decisions_table(found, wide=wide, full_ids=full_ids)
            console = Console()
            if wide or full_ids:
                # Like `kubectl -o wide`: as wide as the rows need, never cut.
                needed = Console(width=MAX_WIDE).measure(table).maximum
                console = Console(width=max(console.width, min(needed, MAX_WIDE)))
            console.print(table)

    @app.command("status")
    def status(
        run: Annotated[
            str | None, typer.Option(help="Run to summarize (default: the latest).")
        ] = None,
        tau: Annotated[
            float, typer.Option(min=0.001, help="Deadline tau for T_norm, seconds.")
        ] = TAU_S,
        as_json: JsonOption = False,
        store: StoreOption = None,
    ) -> None:
        """What the store holds, and the latest run's per-LM success and latency."""
        with _reading(store) as db:
            st = db.status()
            run_id = run or (st.latest_run.id if st.latest_run else None)
            stats = db.lm_stats(run_id) if run_id else []
        report = _status_report(st.backend, st.where, st.counts, run_id, stats, tau)
        report["validators"], report["ttl"] = st.validators, st.ttl
        if as_json:
            typer.echo(json.dumps(report, indent=2))
            return
        console = Console()
        console.print(
            f"[bold]{st.where}[/bold] ({st.backend}; "
            f"validators: {'on' if st.validators else 'off'}, "
            f"telemetry TTL: {'on' if st.ttl else 'off'})",
            highlight=False,
        )
        counts = Table("collection", "documents", title="documents", title_justify="left")
        for name, n in st.counts.items():
            counts.add_row(name, str(n))
        console.print(counts)
        if run_id is None:
            console.print("no run registered yet")
            return
        console.print(_run_table(report))


def _status_report(
    backend: str,
    where: str,
    counts: dict[str, int],
    run_id: str | None,
    stats: list[Any],
    tau: float,
) -> dict[str, Any]:
    """The run summary: per-LM rows plus Jain, T_norm and the objective (paper §III)."""
    requests = sum(s.arrivals for s in stats)
    successes = sum(s.successes for s in stats)
    rejected = sum(s.rejected for s in stats)
    latency_sum = sum((s.mean_latency_s or 0.0) * s.successes for s in stats)
    f, f_norm = fairness([s.success_ratio for s in stats if s.success_ratio is not None])
    t_norm = (latency_sum / successes / tau) if successes else (1.0 if requests else None)
    return {
        "backend": backend,
        "where": where,
        "counts": counts,
        "run": run_id,
        "requests": requests,
        "successes": successes,
        "rejected": rejected,
        "rejected_ratio": rejected / requests if requests else None,
        "mean_latency_s": latency_sum / successes if successes else None,
        "jain": f,
        "t_norm": t_norm,
        "objective": objective(t_norm, f_norm)
        if t_norm is not None and f_norm is not None
        else None,
        "lambda": LAMBDA,
        "tau_s": tau,
        "per_lm": [s.model_dump(mode="json") for s in stats],
    }


def _run_table(report: dict[str, Any]) -> Table:
    title = (
        f"run {report['run']}: {report['requests']} requests, "
        f"Jain {_fmt(report['jain'], '.3f')}, objective {_fmt(report['objective'], '.3f')}"
    )
    table = Table(title=title, title_justify="left")
    for col in ("LM", "requests", "successes", "rejected", "success ratio", "mean latency (s)"):
        table.add_column(col, justify="left" if col == "LM" else "right")
    for s in report["per_lm"]:
        table.add_row(
            s["lm"],
            str(s["arrivals"]),
            str(s["successes"]),
            str(s["rejected"]),
            _fmt(s["success_ratio"], ".3f"),
            _fmt(s["mean_latency_s"], ".1f"),
        )
    table.add_row(
        "all",
        str(report["requests"]),
        str(report["successes"]),
        str(report["rejected"]),
        _fmt(report["successes"] / report["requests"] if report["requests"] else None, ".3f"),
        _fmt(report["mean_latency_s"], ".1f"),
        style="bold",
    )
    return table
