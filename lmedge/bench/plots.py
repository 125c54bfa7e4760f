"""Figures of bench and reproduce reports, in the style of the paper's Figs. 6-9.

- Fig. 6: Jain's index and LM-mean latency per window, box plots per policy;
- Fig. 7: per-LM mean latency and success ratio, grouped bars per policy;
- Fig. 8: rolling objective with bootstrap confidence bands, one panel per policy;
- Fig. 9: (bench) the objective per window, one line per policy; (reproduce)
  the bursty trace: arrivals by LM, and the rolling objective with its
  bands, phases marked.

Inputs are run summaries (`lmedge.bench.summary.summarize`), several seeds per
policy pooled: windows are pooled for the box plots, bars and lines are means
over seeds; or the series `lmedge.bench.stats` computed. Every policy keeps
one colour across figures, legends sit outside the data, latency axes show
the deadline τ when it is given. Uses matplotlib's non-interactive Agg backend
(headless machines); nothing here decides a number.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.figure import Figure

Summary = dict[str, Any]
#: Windows in the rolling mean of the bench's Fig. 9.
ROLLING = 3
#: Resolution of raster figures (the docs keep PNGs at this resolution).
DPI = 150
#: A fixed colour per profile (tab10, then two more), so a policy looks the same everywhere.
PALETTE: dict[str, str] = {
    "ma": "#d62728",
    "mal": "#ff7f0e",
    "perllm": "#1f77b4",
    "milp": "#9467bd",
    "rr": "#7f7f7f",
    "rl": "#8c564b",
    "al": "#e377c2",
    "ll": "#2ca02c",
    "rf": "#17becf",
    "cema": "#bcbd22",
    "lyreo-greedy": "#393b79",
}
_FALLBACK = ("#637939", "#843c39", "#7b4173", "#3182bd", "#e6550d", "#31a354")
LM_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b")


def colour(policy: str, index: int = 0) -> str:
    """The policy's colour; profiles outside the palette cycle through a fallback set."""
    base = policy.split("[", 1)[0]
    return PALETTE.get(base, _FALLBACK[index % len(_FALLBACK)])


def save(fig: Figure, path: Path, formats: Sequence[str] = ("png",)) -> list[Path]:
    """Write `fig` as `path` with each suffix in `formats`; closes it."""
    out = []
    for fmt in formats:
        p = path.with_suffix(f".{fmt}")
        # Text stays text in SVGs: searchable, selectable, editable in a paper.
        with matplotlib.rc_context({"svg.fonttype": "none"}):
            fig.savefig(p, dpi=DPI, bbox_inches="tight")
        out.append(p)
    plt.close(fig)
    return out


def _by_policy(summaries: Sequence[Summary]) -> dict[str, list[Summary]]:
    out: dict[str, list[Summary]] = {}
    for s in summaries:
        out.setdefault(s["policy"], []).append(s)
    return out


def _mean(xs: Sequence[float | None]) -> float:
    ys = [x for x in xs if x is not None]
    return sum(ys) / len(ys) if ys else float("nan")


def _tau(ax: Any, tau_s: float | None, horizontal: bool = True) -> None:
    if tau_s is not None:
        ax.axhline(tau_s, color="black", linestyle="--", linewidth=1, label=f"τ = {tau_s:.0f} s")


def _window_latency(w: Mapping[str, Any]) -> float | None:
    """The window's LM-mean latency (the paper's reading), else its request-weighted mean."""
    v = w.get("lm_mean_latency_s")
    return v if v is not None or "lm_mean_latency_s" in w else w.get("mean_latency_s")


def fig6(
    summaries: Sequence[Summary],
    path: Path,
    title: str,
    *,
    tau_s: float | None = None,
    marked: Sequence[str] = (),
    formats: Sequence[str] = ("png",),
) -> Path:
    """Box plots over windows of Jain's index and LM-mean latency; `marked` policies hatched."""
    groups = _by_policy(summaries)
    names = list(groups)
    jain = [
        [w["jain"] for s in groups[n] for w in s["windows"] if w["jain"] is not None] for n in names
    ]
    lat = [
        [v for s in groups[n] for w in s["windows"] if (v := _window_latency(w)) is not None]
        for n in names
    ]
    fig, (a, b) = plt.subplots(
        1, 2, figsize=(max(7.0, 0.9 * len(names) + 4), 4.2), layout="constrained"
    )
    for ax, data in ((a, jain), (b, lat)):
        boxes = ax.boxplot(data, tick_labels=names, patch_artist=True, widths=0.6)
        for k, (box, n) in enumerate(zip(boxes["boxes"], names, strict=True)):
            box.set_facecolor(colour(n, k))
            box.set_alpha(0.75)
            if n in marked:
                box.set_hatch("//")
        for med in boxes["medians"]:
            med.set_color("black")
        ax.tick_params(axis="x", rotation=45)
        ax.grid(axis="y", alpha=0.3)
        ax.set_xlabel("policy")
    a.set_title("(a) Jain's index per window")
    a.set_ylabel("Jain's index over LM success ratios")
    a.set_ylim(0, 1.05)
    b.set_title("(b) LM-mean latency per window")
    b.set_ylabel("latency of successes (s)")
    _tau(b, tau_s)
    handles, labels = b.get_legend_handles_labels()
    if marked:
        from matplotlib.patches import Patch

        handles.append(Patch(facecolor="white", edgecolor="black", hatch="//"))
        labels.append("not in the paper")
    if handles:
        b.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize="small")
    fig.suptitle(title)
    save(fig, path, formats)
    return path


def fig7(
    summaries: Sequence[Summary],
    path: Path,
    title: str,
    *,
    tau_s: float | None = None,
    formats: Sequence[str] = ("png",),
) -> Path:
    """Per-LM mean latency of successes and success ratio, bars per policy (means over seeds)."""
    groups = _by_policy(summaries)
    names = list(groups)
    lms = [x["lm"] for x in summaries[0]["per_lm"]] if summaries else []
    width = 0.8 / max(1, len(names))
    fig, (a, b) = plt.subplots(
        1, 2, figsize=(max(8.0, 0.35 * len(lms) * len(names) + 4), 4.2), layout="constrained"
    )
    for k, n in enumerate(names):
        rows = [{x["lm"]: x for x in s["per_lm"]} for s in groups[n]]
        xs = [i + (k - (len(names) - 1) / 2) * width for i in range(len(lms))]
        style = {"color": colour(n, k), "label": n}
        a.bar(
            xs,
            [_mean([r[lm]["mean_latency_s"] for r in rows if lm in r]) for lm in lms],
            width,
            **style,
        )
        b.bar(
            xs,
            [_mean([r[lm]["success_ratio"] for r in rows if lm in r]) for lm in lms],
            width,
            **style,
        )
    a.set_title("(a) Mean latency of successes")
    # LM1-LM3 are served in seconds and LM4 in minutes: a log axis shows both.
    a.set_yscale("log")
    a.set_ylabel("latency (s, log scale)")
    _tau(a, tau_s)
    b.set_title("(b) Success ratio")
    b.set_ylabel("successes / arrivals")
    b.set_ylim(0, 1.05)
    for ax in (a, b):
        ax.set_xticks(range(len(lms)), lms)
        ax.set_xlabel("LM")
        ax.grid(axis="y", alpha=0.3)
    handles, labels = a.get_legend_handles_labels()
    b.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize="small")
    fig.suptitle(title)
    save(fig, path, formats)
    return path


def fig9(
    summaries: Sequence[Summary],
    path: Path,
    title: str,
    *,
    slot_s: float | None = None,
    formats: Sequence[str] = ("png",),
) -> Path:
    """The bench's objective per window over time, with a rolling mean over `ROLLING` windows."""
    groups = _by_policy(summaries)
    fig, ax = plt.subplots(figsize=(8, 4), layout="constrained")
    for k, (n, runs) in enumerate(groups.items()):
        count = max(len(s["windows"]) for s in runs)
        series = [
            _mean([s["windows"][i]["objective"] for s in runs if i < len(s["windows"])])
            for i in range(count)
        ]
        starts = [runs[0]["windows"][i]["start_slot"] for i in range(count)]
        rolling = [_mean(series[max(0, i - ROLLING + 1) : i + 1]) for i in range(count)]
        c = colour(n, k)
        ax.plot(starts, rolling, color=c, label=f"{n} (rolling {ROLLING})")
        ax.plot(starts, series, color=c, alpha=0.25)
    ax.set_xlabel(f"slot ({slot_s:g} s each)" if slot_s else "slot")
    ax.set_ylabel("objective J (lower is better)")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize="small")
    ax.set_title(title)
    save(fig, path, formats)
    return path


def _band(ax: Any, curve: Sequence[Mapping[str, Any]], name: str, k: int) -> None:
    pts = [c for c in curve if c["objective"] is not None]
    xs = [c["end_slot"] for c in pts]
    c = colour(name, k)
    ax.plot(xs, [p["objective"] for p in pts], color=c, label=name)
    ax.fill_between(xs, [p["lo"] for p in pts], [p["hi"] for p in pts], color=c, alpha=0.2)


def fig8(
    curves: Mapping[str, Sequence[Mapping[str, Any]]],
    path: Path,
    title: str,
    *,
    formats: Sequence[str] = ("png",),
) -> Path:
    """One panel per policy: rolling J and its bootstrap band (`lmedge.bench.stats`)."""
    names = list(curves)
    fig, axes = plt.subplots(
        1, max(1, len(names)), figsize=(5 * max(1, len(names)), 3.8), sharey=True
    )
    axes = axes if len(names) > 1 else [axes]
    for k, (ax, n) in enumerate(zip(axes, names, strict=False)):
        _band(ax, curves[n], n, k)
        ax.set_title(f"({chr(97 + k)}) {n}")
        ax.set_xlabel("slot (end of the rolling window)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("objective J (lower is better)")
    axes[0].set_ylim(bottom=0)
    from matplotlib.patches import Patch

    axes[-1].legend(
        [Patch(color="grey", alpha=0.3)],
        ["bootstrap 95% CI"],
        loc="upper left",
        bbox_to_anchor=(1.02, 1.0),
        fontsize="small",
    )
    fig.suptitle(title)
    save(fig, path, formats)
    return path


def fig9_bursty(
    arrivals: Mapping[str, Sequence[float]],
    curves: Mapping[str, Sequence[Mapping[str, Any]]],
    phases: Sequence[Sequence[Any]],
    step: int,
    path: Path,
    title: str,
    *,
    formats: Sequence[str] = ("png",),
) -> Path:
    """(a) prompts per slot by LM; (b) rolling J with bands; phase boundaries marked."""
    fig, (a, b) = plt.subplots(2, 1, figsize=(9, 6.5), sharex=True, layout="constrained")
    for k, (lm, counts) in enumerate(arrivals.items()):
        xs = [i * step + step / 2 for i in range(len(counts))]
        a.plot(xs, counts, color=LM_COLOURS[k % len(LM_COLOURS)], label=lm)
    a.set_ylabel("prompts per slot")
    a.set_title(f"(a) Arrivals by LM (all origins, mean over {step}-slot windows)")
    for k, (n, curve) in enumerate(curves.items()):
        _band(b, curve, n, k)
    b.set_ylabel("objective J (lower is better)")
    b.set_xlabel("slot (30 s each)")
    b.set_title("(b) Rolling objective, bootstrap 95% CI")
    b.set_ylim(bottom=0)
    if phases:
        b.set_xlim(0, phases[-1][2])
    for ax in (a, b):
        ax.grid(alpha=0.3)
        for i, (name, start, end) in enumerate(phases):
            if i:
                ax.axvline(start, color="black", linestyle=":", linewidth=1)
            # burst phases shaded, so a reader sees at once where the load peaks
            if "burst" in str(name).lower():
                ax.axvspan(start, end, color="#fdd0a2", alpha=0.35, linewidth=0, zorder=0)
            if ax is a:
                ax.annotate(
                    name,
                    (start, 1.0),
                    xycoords=("data", "axes fraction"),
                    xytext=(4, -12),
                    textcoords="offset points",
                    fontsize="small",
                )
        ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize="small")
    fig.suptitle(title)
    save(fig, path, formats)
    return path
