"""PNG figures of a bench report, in the style of the paper's Figs. 6, 7 and 9.

- Fig. 6: Jain's index and mean latency per window, box plots per policy;
- Fig. 7: per-LM mean latency and success ratio, grouped bars per policy;
- Fig. 9: the objective J per window over time, one line per policy, with a
  rolling mean.

Inputs are run summaries (`lmedge.bench.summary.summarize`), several seeds
per policy pooled: windows are pooled for the box plots, bars and lines are
means over seeds. Uses matplotlib's non-interactive Agg backend, so it works
on headless machines; nothing here decides a number.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

Summary = dict[str, Any]
#: Windows in the rolling mean of Fig. 9.
ROLLING = 3


def _by_policy(summaries: Sequence[Summary]) -> dict[str, list[Summary]]:
    out: dict[str, list[Summary]] = {}
    for s in summaries:
        out.setdefault(s["policy"], []).append(s)
    return out


def _mean(xs: Sequence[float | None]) -> float:
    ys = [x for x in xs if x is not None]
    return sum(ys) / len(ys) if ys else float("nan")


def fig6(summaries: Sequence[Summary], path: Path, title: str) -> Path:
    groups = _by_policy(summaries)
    names = list(groups)
    jain = [
        [w["jain"] for s in groups[n] for w in s["windows"] if w["jain"] is not None] for n in names
    ]
    lat = [
        [
            w["mean_latency_s"]
            for s in groups[n]
            for w in s["windows"]
            if w["mean_latency_s"] is not None
        ]
        for n in names
    ]
    fig, (a, b) = plt.subplots(1, 2, figsize=(max(6.0, 1.6 * len(names) + 3), 4))
    a.boxplot(jain, tick_labels=names)
    a.set_title("Jain's index per window")
    a.set_ylim(0, 1.05)
    b.boxplot(lat, tick_labels=names)
    b.set_title("Mean latency per window (s)")
    for ax in (a, b):
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def fig7(summaries: Sequence[Summary], path: Path, title: str) -> Path:
    groups = _by_policy(summaries)
    names = list(groups)
    lms = [x["lm"] for x in summaries[0]["per_lm"]] if summaries else []
    width = 0.8 / max(1, len(names))
    fig, (a, b) = plt.subplots(1, 2, figsize=(max(7.0, 1.2 * len(lms) * len(names) / 2 + 4), 4))
    for k, n in enumerate(names):
        rows = [{x["lm"]: x for x in s["per_lm"]} for s in groups[n]]
        xs = [i + (k - (len(names) - 1) / 2) * width for i in range(len(lms))]
        a.bar(
            xs,
            [_mean([r[lm]["mean_latency_s"] for r in rows if lm in r]) for lm in lms],
            width,
            label=n,
        )
        b.bar(
            xs,
            [_mean([r[lm]["success_ratio"] for r in rows if lm in r]) for lm in lms],
            width,
            label=n,
        )
    for ax, t in ((a, "Mean latency of successes (s)"), (b, "Success ratio")):
        ax.set_xticks(range(len(lms)), lms)
        ax.set_title(t)
        ax.grid(axis="y", alpha=0.3)
    b.set_ylim(0, 1.05)
    b.legend(fontsize="small")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def fig9(summaries: Sequence[Summary], path: Path, title: str) -> Path:
    groups = _by_policy(summaries)
    fig, ax = plt.subplots(figsize=(8, 4))
    for n, runs in groups.items():
        count = max(len(s["windows"]) for s in runs)
        series = [
            _mean([s["windows"][i]["objective"] for s in runs if i < len(s["windows"])])
            for i in range(count)
        ]
        starts = [runs[0]["windows"][i]["start_slot"] for i in range(count)]
        rolling = [_mean(series[max(0, i - ROLLING + 1) : i + 1]) for i in range(count)]
        (line,) = ax.plot(starts, rolling, label=f"{n} (rolling {ROLLING})")
        ax.plot(starts, series, color=line.get_color(), alpha=0.25)
    ax.set_xlabel("slot")
    ax.set_ylabel("objective J (lower is better)")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
