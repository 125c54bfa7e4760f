"""`lmedge policies`: the policy profiles and plugins this installation has, one line each.

Reads the plugin catalog (`lmedge.controller.catalog`), so a plugin family
that failed to load (an optional extra missing) is named with the reason
instead of silently missing from the list.
"""

from __future__ import annotations

import json
import shutil
from typing import Annotated, Any, cast

import typer

from lmedge.controller import catalog
from lmedge.processes.plugins import register_plugins


def _fit(text: str, width: int) -> str:
    """`text` on one line of at most `width` characters (cut with an ellipsis)."""
    text = " ".join(text.split())
    return text if len(text) <= width else text[: max(width - 1, 0)] + "…"


def _tables() -> list[tuple[str, dict[str, catalog.PluginEntry[Any]]]]:
    return [
        ("planners", cast(dict[str, catalog.PluginEntry[Any]], catalog.PLANNERS)),
        ("routers", cast(dict[str, catalog.PluginEntry[Any]], catalog.ROUTERS)),
        ("deployers", cast(dict[str, catalog.PluginEntry[Any]], catalog.DEPLOYERS)),
    ]


def _listing() -> dict[str, Any]:
    register_plugins()
    unavailable: dict[str, str] = catalog.UNAVAILABLE
    return {
        "profiles": [
            {
                "name": p.name,
                "planner": p.planner,
                "router": p.router,
                "deployer": p.deployer,
                "summary": p.summary,
            }
            for p in sorted(catalog.PROFILES.values(), key=lambda p: p.name)
        ],
        **{
            kind: [
                {"name": e.name, "summary": e.summary}
                for e in sorted(table.values(), key=lambda e: e.name)
            ]
            for kind, table in _tables()
        },
        "unavailable": dict(sorted(unavailable.items())),
    }


def register(app: typer.Typer) -> None:
    @app.command("policies")
    def policies(
        as_json: Annotated[
            bool, typer.Option("--json", help="Print JSON instead of text.")
        ] = False,
        wide: Annotated[
            bool, typer.Option("--wide", help="Do not cut summaries to the terminal width.")
        ] = False,
    ) -> None:
        """The policy profiles (for --policy) and the plugins they compose, one line each."""
        listing = _listing()
        if as_json:
            typer.echo(json.dumps(listing, indent=2))
            return
        width = 10_000 if wide else shutil.get_terminal_size((80, 24)).columns
        profiles = listing["profiles"]
        name_w = max((len(p["name"]) for p in profiles), default=4) + 2
        parts = [f"{p['planner']}/{p['router']}/{p['deployer']}" for p in profiles]
        parts_w = max((len(x) for x in parts), default=0) + 2
        lines = ["profiles (--policy NAME): planner/router/deployer, then what it is"]
        for p, composed in zip(profiles, parts, strict=True):
            head = f"  {p['name']:<{name_w}}{composed:<{parts_w}}"
            lines.append(head + _fit(p["summary"], width - len(head)))
        for kind, flag in (
            ("planners", "--planner"),
            ("routers", "--router"),
            ("deployers", "--deployer"),
        ):
            entries = listing[kind]
            name_w = max((len(e["name"]) for e in entries), default=4) + 2
            lines.append("")
            lines.append(f"{kind} ({flag} NAME)")
            for e in entries:
                head = f"  {e['name']:<{name_w}}"
                lines.append(head + _fit(e["summary"], width - len(head)))
        if listing["unavailable"]:
            lines.append("")
            lines.append("not loaded (install the extra they need):")
            lines += [
                "  " + _fit(f"{family}: {why}", width - 2)
                for family, why in listing["unavailable"].items()
            ]
        typer.echo("\n".join(lines))
