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
from rich.console import Console
from rich.table import Table

from lmedge.api.decisions import MacroPolicy, Placement, RoutingMap
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
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


class AgentName(StrEnum):
    planner = "planner"
    scheduler = "scheduler"
    deployer = "deployer"


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


def _decisions_table(found: list[AnyDecision]) -> Table:
    table = Table(title=f"{len(found)} latest decisions", title_justify="left")
    for col in ("created", "run", "agent", "epoch", "slot", "node", "policy", "source"):
        table.add_column(col, no_wrap=col in ("created", "agent"))
    table.add_column("outcome")
    table.add_column("s", justify="right")
    table.add_column("value")
    for d in found:
        outcome: str = d.outcome
        if not d.parsed:
            outcome += " (unparsed)"
        elif not d.validated:
            outcome += f" ({len(d.violations)} violations)"
        if d.error:
            outcome += f" [{d.error}]"
        table.add_row(
            d.created_at.strftime("%Y-%m-%d %H:%M:%S"),
            d.run or "-",
            d.agent,
            str(d.epoch),
            str(d.slot),
            d.node or "-",
            d.policy,
            d.source,
            outcome,
            f"{d.latency_s:.2f}",
            summarize(d),
        )
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
        limit: Annotated[int, typer.Option("--limit", "-n", min=1, help="At most this many.")] = 20,
        as_json: JsonOption = False,
        store: StoreOption = None,
    ) -> None:
        """The latest agent decisions, newest first, with how each was validated."""
        with _reading(store) as db:
            found = db.decisions(
                agent=agent.value if agent else None,
                run=run,
                epoch=epoch,
                slot=slot,
                node=node,
                limit=limit,
            )
            if not found:
                db.status()  # an empty store raises its own, clearer error
                raise ConfigError(f"no decisions in {db.where} match the filters")
        if as_json:
            typer.echo(json.dumps([d.model_dump(mode="json") for d in found], indent=2))
        else:
            Console().print(_decisions_table(found))

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
