"""Figures of `lmedge reproduce --paper lyreo`, analogs of LYREO's Figs. 2-7.

Inputs are the series `lmedge.bench.lyreo_evaluation` computed (training
curves, latency quantiles, per-point means); colours and file writing are
`lmedge.bench.plots`'. Nothing here decides a number.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt

from lmedge.bench.checks import label
from lmedge.bench.plots import colour, save

NAN = float("nan")


def _num(x: float | None) -> float:
    return NAN if x is None else x


def convergence(
    curves: Mapping[str, Sequence[Mapping[str, Any]]],
    path: Path,
    title: str,
    formats: Sequence[str],
) -> list[Path]:
    """Fig. 2: latency and Z per training episode, one line per learned scheduler."""
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.6), layout="constrained")
    for k, (name, curve) in enumerate(curves.items()):
        xs = [e["episode"] for e in curve]
        c = colour(name, k)
        a.plot(xs, [e["mean_latency_s"] for e in curve], marker="o", color=c, label=label(name))
        b.plot(xs, [e["mean_z"] for e in curve], marker="o", color=c, label=label(name))
    a.set(title="(a) mean latency", xlabel="episode", ylabel="latency (s)")
    b.set(title="(b) mean virtual queue Z", xlabel="episode", ylabel="Z")
    for ax in (a, b):
        ax.grid(alpha=0.3)
    b.legend(loc="upper left", bbox_to_anchor=(1.02, 1))
    fig.suptitle(title)
    return save(fig, path, formats)


def distributions(
    data: Mapping[str, Mapping[str, Any]], path: Path, title: str, formats: Sequence[str]
) -> list[Path]:
    """Fig. 3: latency boxes (P25-P75, whiskers P5-P95) and each run's deviation Y."""
    names = list(data)
    fig, (a, b) = plt.subplots(
        1, 2, figsize=(max(8.0, 0.8 * len(names) + 4), 4), layout="constrained"
    )
    stats = []
    for n in names:
        q = [_num(x) for x in data[n]["latency_quantiles"]] or [NAN] * 21
        stats.append(
            {"label": label(n), "med": q[10], "q1": q[5], "q3": q[15], "whislo": q[1],
             "whishi": q[19], "fliers": []}
        )  # fmt: skip
    boxes = a.bxp(stats, patch_artist=True, widths=0.6)
    for k, (box, n) in enumerate(zip(boxes["boxes"], names, strict=True)):
        box.set_facecolor(colour(n, k))
        box.set_alpha(0.75)
    for med in boxes["medians"]:
        med.set_color("black")
    for k, n in enumerate(names):
        ys = data[n]["deviations"]
        b.scatter([k] * len(ys), ys, color=colour(n, k), zorder=3)
    b.set_xticks(range(len(names)), [label(n) for n in names])
    a.set(title="(a) end-to-end latency of successes", ylabel="latency (s)")
    b.set(title="(b) mean deviation Y per run", ylabel="Y")
    for ax in (a, b):
        ax.tick_params(axis="x", rotation=45)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(title)
    return save(fig, path, formats)


def sweep(
    data: Mapping[str, Any], axis: str, path: Path, title: str, formats: Sequence[str]
) -> list[Path]:
    """Figs. 4-5: latency and deviation against the sweep's points, one line per method."""
    points = list(data["points"])
    methods = list(dict.fromkeys(p for pt in points for p in data["latency"][pt]))
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.6), layout="constrained")
    xs = [float(p) for p in points]
    for k, m in enumerate(methods):
        c = colour(m, k)
        lat = [_num(data["latency"][pt].get(m)) for pt in points]
        dev = [_num(data["deviation"][pt].get(m)) for pt in points]
        a.plot(xs, lat, marker="o", color=c, label=label(m))
        b.plot(xs, dev, marker="o", color=c, label=label(m))
    a.set(title="(a) mean latency", xlabel=axis, ylabel="latency (s)")
    b.set(title="(b) mean deviation Y", xlabel=axis, ylabel="Y")
    for ax in (a, b):
        ax.grid(alpha=0.3)
    b.legend(loc="upper left", bbox_to_anchor=(1.02, 1))
    fig.suptitle(title)
    return save(fig, path, formats)


def heterogeneity(
    data: Mapping[str, Any], path: Path, title: str, formats: Sequence[str]
) -> list[Path]:
    """Fig. 6: deviation Y per method, one bar per hardware mix."""
    mixes = list(data["mixes"])
    methods = list(dict.fromkeys(p for mix in mixes for p in data["deviation"][mix]))
    fig, ax = plt.subplots(figsize=(max(7.0, 0.8 * len(methods) + 3), 3.8), layout="constrained")
    width = 0.8 / max(len(mixes), 1)
    for j, mix in enumerate(mixes):
        ys = [_num(data["deviation"][mix].get(m)) for m in methods]
        ax.bar([i + j * width for i in range(len(methods))], ys, width, label=mix)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(methods))], [label(m) for m in methods])
    ax.tick_params(axis="x", rotation=45)
    ax.set(ylabel="mean deviation Y")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1))
    fig.suptitle(title)
    return save(fig, path, formats)


def sensitivity(
    nu: Mapping[str, Any] | None,
    horizons: Mapping[str, Sequence[Mapping[str, Any]]] | None,
    path: Path,
    title: str,
    formats: Sequence[str],
) -> list[Path]:
    """Fig. 7: (a) latency and Y against nu; (b) training latency per episode for each H."""
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.6), layout="constrained")
    if nu:
        a.plot(nu["nu"], [_num(x) for x in nu["latency"]], marker="o", color="#1f77b4")
        a.set_xscale("log")
        twin = a.twinx()
        twin.plot(nu["nu"], [_num(x) for x in nu["deviation"]], marker="s", color="#d62728")
        twin.set_ylabel("deviation Y", color="#d62728")
    a.set(title="(a) latency weight ν", xlabel="ν", ylabel="mean latency (s)")
    for k, (h, curve) in enumerate((horizons or {}).items()):
        b.plot(
            [e["episode"] for e in curve],
            [e["mean_latency_s"] for e in curve],
            marker="o",
            color=plt.get_cmap("viridis")(k / max(len(horizons or {}) - 1, 1)),
            label=f"H = {h}",
        )
    b.set(title="(b) truncation H (training)", xlabel="episode", ylabel="latency (s)")
    if horizons:
        b.legend(loc="upper left", bbox_to_anchor=(1.02, 1))
    for ax in (a, b):
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    return save(fig, path, formats)
