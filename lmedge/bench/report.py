"""A bench report folder: `summary.json`, `summary.md` and the PNG figures.

Layout, for scenarios S and policies P run over seeds:

    summary.json        {"runs": [summary, ...], "scenarios": {S: {P: means over seeds}}}
    summary.md          per scenario: headline table, per-LM table, conflicts
                        (Table II analog), reconfiguration (Table III analog),
                        decision audit, and links to the figures
    fig6-S.png  fig7-S.png  fig9-S.png

`summary.json` holds only deterministic summaries; timings (which differ from
run to run) are in `timing.json`, so a report can be diffed against another.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, cast

from lmedge.bench import plots
from lmedge.bench.summary import dumps, rounded

Summary = dict[str, Any]
HEADLINE = ("objective", "jain", "f_norm", "t_norm", "mean_latency_s", "success_ratio")


def _mean(xs: Sequence[Any]) -> float | None:
    ys = [x for x in xs if x is not None]
    return sum(ys) / len(ys) if ys else None


def aggregate(summaries: Sequence[Summary]) -> dict[str, dict[str, dict[str, Any]]]:
    """{scenario: {policy: headline means over seeds}}, in first-seen order."""
    groups: dict[str, dict[str, list[Summary]]] = {}
    for s in summaries:
        groups.setdefault(s["scenario"], {}).setdefault(s["policy"], []).append(s)
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for sc, by_policy in groups.items():
        out[sc] = {}
        for policy, runs in by_policy.items():
            row: dict[str, Any] = {"seeds": [r["seed"] for r in runs]}
            for key in (
                *HEADLINE,
                "window_mean_jain",
                "window_mean_latency_s",
                "window_mean_objective",
            ):
                row[key] = _mean([r[key] for r in runs])
            row["lm_mean_latency_s"] = _mean([r.get("lm_mean_latency_s") for r in runs])
            row["lm_mean_penalized_latency_s"] = _mean(
                [r.get("lm_mean_penalized_latency_s") for r in runs]
            )
            # absent from summaries written before admission control existed: 0 refused
            row["rejected_ratio"] = _mean([r.get("rejected_ratio", 0.0) for r in runs])
            row["conflict_ratio"] = _mean([r["conflicts"]["ratio"] for r in runs])
            row["conflict_timeout_ratio"] = _mean(
                [r["conflicts"]["conflict_timeout_ratio"] for r in runs]
            )
            row["activations_per_100"] = _mean(
                [r["reconfiguration"]["activations_per_100"] for r in runs]
            )
            row["deactivations_per_100"] = _mean(
                [r["reconfiguration"]["deactivations_per_100"] for r in runs]
            )
            out[sc][policy] = row
    return cast(dict[str, dict[str, dict[str, Any]]], rounded(out))


def _fmt(x: Any, digits: int = 3) -> str:
    if x is None:
        return "–"
    if isinstance(x, float):
        return f"{x:.{digits}f}"
    return str(x)


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_fmt(c) for c in r) + " |" for r in rows]
    return [*lines, ""]


def _markdown(summaries: Sequence[Summary], figures: dict[str, list[str]]) -> str:
    agg = aggregate(summaries)
    lines = ["# lmedge bench report", ""]
    lines += [
        'Metrics as in docs/design.md "Metrics" (paper §III): '
        "objective J = λ·T_norm + (1−λ)(1−F_norm), lower is better; "
        "latency is over successful requests (LM-mean at τ: the LM-mean latency with every "
        "failed request counted at its deadline); `rejected` is the share "
        "refused by admission control (failures, counted in success). Values are means over seeds; "
        f"windows are {summaries[0]['window_slots'] if summaries else '?'} slots.",
        "",
    ]
    for sc, by_policy in agg.items():
        runs = [s for s in summaries if s["scenario"] == sc]
        lines += [f"## Scenario `{sc}`", ""]
        lines += _table(
            [
                "policy",
                "seeds",
                "J",
                "Jain",
                "F_norm",
                "T_norm",
                "latency (s)",
                "LM-mean at τ (s)",
                "success",
                "rejected",
                "window Jain",
                "window latency (s)",
            ],
            [
                [
                    p,
                    ",".join(map(str, r["seeds"])),
                    r["objective"],
                    r["jain"],
                    r["f_norm"],
                    r["t_norm"],
                    r["mean_latency_s"],
                    r["lm_mean_penalized_latency_s"],
                    r["success_ratio"],
                    r["rejected_ratio"],
                    r["window_mean_jain"],
                    r["window_mean_latency_s"],
                ]
                for p, r in by_policy.items()
            ],
        )
        lms = [x["lm"] for x in runs[0]["per_lm"]] if runs else []
        lines += ["### Per LM (latency s / success ratio)", ""]
        per_lm_rows = []
        for p in by_policy:
            mine = [s for s in runs if s["policy"] == p]
            cells: list[Any] = [p]
            for lm in lms:
                stats = [x for s in mine for x in s["per_lm"] if x["lm"] == lm]
                lat = _mean([x["mean_latency_s"] for x in stats])
                ok = _mean([x["success_ratio"] for x in stats])
                cells.append(f"{_fmt(lat, 1)} / {_fmt(ok)}")
            per_lm_rows.append(cells)
        lines += _table(["policy", *lms], per_lm_rows)
        lines += ["### Inactive-target conflicts (Table II analog, cross-node requests)", ""]
        lines += _table(
            [
                "policy",
                "conflict ratio",
                "queue delay conflict (s)",
                "queue delay other (s)",
                "timeout ratio of conflicts",
            ],
            [
                [
                    p,
                    _mean([s["conflicts"]["ratio"] for s in runs if s["policy"] == p]),
                    _mean(
                        [s["conflicts"]["conflict_queue_delay_s"] for s in runs if s["policy"] == p]
                    ),
                    _mean(
                        [
                            s["conflicts"]["non_conflict_queue_delay_s"]
                            for s in runs
                            if s["policy"] == p
                        ]
                    ),
                    _mean(
                        [s["conflicts"]["conflict_timeout_ratio"] for s in runs if s["policy"] == p]
                    ),
                ]
                for p in by_policy
            ],
        )
        lines += ["### Reconfiguration (Table III analog, per 100 node-slot decisions)", ""]
        lines += _table(
            ["policy", "activations", "deactivations", "active-set change ratio"],
            [
                [
                    p,
                    r["activations_per_100"],
                    r["deactivations_per_100"],
                    _mean(
                        [s["reconfiguration"]["set_change_ratio"] for s in runs if s["policy"] == p]
                    ),
                ]
                for p, r in by_policy.items()
            ],
        )
        lines += ["### Decision audit (all seeds)", ""]
        audit_rows = []
        for p in by_policy:
            totals: dict[tuple[str, str], list[int]] = {}
            for s in runs:
                if s["policy"] != p:
                    continue
                for a in s["audit"]:
                    if a["source"] == "*":
                        continue
                    acc = totals.setdefault((a["agent"], a["source"]), [0, 0, 0, 0])
                    for i, k in enumerate(("calls", "accepted", "replaced", "errors")):
                        acc[i] += a[k]
            audit_rows += [[p, ag, src, *v] for (ag, src), v in totals.items()]
        lines += _table(
            ["policy", "agent", "source", "calls", "accepted", "replaced", "errors"], audit_rows
        )
        lines += [f"![{f}]({f})" for f in figures.get(sc, [])] + [""]
    return "\n".join(lines)


def write_report(
    out: Path,
    summaries: Sequence[Summary],
    timings: Sequence[dict[str, Any]] = (),
    *,
    loops: Mapping[str, tuple[float, float]] | None = None,
) -> Path:
    """Write the report folder `out` (created if needed); returns `out/summary.md`.

    `loops` gives each scenario's (slot_s, tau_s), for the axes and the τ line.
    Figures are written as PNG (150 dpi) and SVG.
    """
    out.mkdir(parents=True, exist_ok=True)
    figures: dict[str, list[str]] = {}
    formats = ("png", "svg")
    for sc in dict.fromkeys(s["scenario"] for s in summaries):
        runs = [s for s in summaries if s["scenario"] == sc]
        slot_s, tau_s = (loops or {}).get(sc, (None, None))
        plots.fig6(
            runs,
            out / f"fig6-{sc}",
            f"{sc}: windows of every seed pooled",
            tau_s=tau_s,
            formats=formats,
        )
        plots.fig7(
            runs,
            out / f"fig7-{sc}",
            f"{sc}: per-LM latency and success",
            tau_s=tau_s,
            formats=formats,
        )
        plots.fig9(
            runs, out / f"fig9-{sc}", f"{sc}: objective per window", slot_s=slot_s, formats=formats
        )
        figures[sc] = [f"{fig}-{sc}.png" for fig in ("fig6", "fig7", "fig9")]
    payload = {"runs": list(summaries), "scenarios": aggregate(summaries)}
    (out / "summary.json").write_text(dumps(payload))
    if timings:
        (out / "timing.json").write_text(json.dumps(list(timings), indent=2) + "\n")
    md = out / "summary.md"
    md.write_text(_markdown(summaries, figures))
    return md
