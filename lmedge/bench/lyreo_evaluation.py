"""LYREO's §V results set beside lmedge's: one `Section` per figure or table.

Each section holds paper-vs-lmedge tables (the paper's value from
`lmedge.bench.lyreo_paper` where it prints one), the `Check`s of the orderings
the paper reports (issue 26, item 7), computed from the numbers, and the
names of its figures. Every run value is a mean over seeds of the run
summary's `balance` (mean and P99 latency of successes, deviation Y, queue Z,
high-KV share), and the sweeps (Figs. 4, 5) add the summary's success ratio:
a point where some method's is below `PAST_CAPACITY_SUCCESS` is past the
cluster's capacity, and its section and its lowest-latency check say so.
Fig. 3's latency distribution pools the successful requests of every seed.
Pure: it reads runs and training curves, it runs nothing.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from lmedge.bench import lyreo_paper as lp
from lmedge.bench.checks import (
    Check,
    Section,
    TableData,
    chain_check,
    extreme_check,
    fmt,
    label,
    pct,
    ranked,
    reduction,
)
from lmedge.bench.grid import mean
from lmedge.bench.runner import RunData

if TYPE_CHECKING:
    from lmedge.bench.lyreo_repro import LyreoReproduction

#: Digits shown per metric.
LAT, DEV, Z = 2, 5, 4
#: A sweep point where some method finishes fewer of its requests than this is past the
#: cluster's capacity: requests time out, and a mean latency is over those that finished.
PAST_CAPACITY_SUCCESS = 0.99


class Cells:
    """Lookups over the runs: means over seeds by (cell, policy)."""

    def __init__(self, runs: Sequence[tuple[str, RunData]]) -> None:
        self.by: dict[tuple[str, str], list[RunData]] = {}
        for key, r in runs:
            self.by.setdefault((key, r.spec.choice.profile or ""), []).append(r)

    def has(self, key: str, policy: str) -> bool:
        return (key, policy) in self.by

    def balance(self, key: str, policy: str, name: str) -> float | None:
        return mean(
            [r.summary.get("balance", {}).get(name) for r in self.by.get((key, policy), [])]
        )

    def success(self, key: str, policy: str) -> float | None:
        return mean([r.summary["success_ratio"] for r in self.by.get((key, policy), [])])

    def deviations(self, key: str, policy: str) -> list[float]:
        runs = self.by.get((key, policy), [])
        return [
            v for r in runs if (v := r.summary.get("balance", {}).get("mean_deviation")) is not None
        ]

    def latencies(self, key: str, policy: str) -> list[float]:
        """Every successful measured request's latency, seeds pooled, sorted."""
        out = [
            lat
            for r in self.by.get((key, policy), [])
            for lat, ok in zip(r.requests.latency_s, r.requests.success, strict=True)
            if ok
        ]
        return sorted(out)


def quantile(xs: Sequence[float], q: float) -> float | None:
    """The q-quantile of sorted `xs` (linear interpolation), None when empty."""
    if not xs:
        return None
    pos = q * (len(xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def evaluate(repro: LyreoReproduction) -> tuple[list[Section], dict[str, Any]]:
    """The sections of the reproduction and the series its figures plot."""
    g = Cells(repro.runs)
    series: dict[str, Any] = {}
    sections = [
        _learned(repro),
        _fig2(repro, series),
        _fig3(g, repro, series),
        _table2(g),
        _sweep(g, repro, "users", series),
        _sweep(g, repro, "servers", series),
        _fig6(g, repro, series),
        _fig7(g, repro, series),
    ]
    return sections, series


def _methods(g: Cells, key: str, among: Sequence[str] = lp.METHODS) -> list[str]:
    return [p for p in among if g.has(key, p)]


def _fallback_note(repro: LyreoReproduction, profiles: Sequence[str]) -> str:
    fell = [label(p) for p in profiles if repro.policies.get(p, "").startswith("fallback")]
    return f" ({', '.join(fell)}: no shipped policy, routed as lyreo-ly)" if fell else ""


def _learned(repro: LyreoReproduction) -> Section:
    sec = Section(
        "policies",
        "Which policy each learned profile used",
        "lmedge's runs, not a paper result",
        note="The evaluation runs use each learned profile's shipped policy; without one it "
        "routes as lyreo-ly (its Lyapunov half) and the learned comparisons below compare "
        "that. The tiny trainings of Figs. 2 and 7b are not used for the runs.",
    )
    sec.tables.append(
        TableData(
            "Policy per learned profile",
            ("profile", "policy used"),
            tuple((label(p), repro.policies.get(p, "–")) for p in lp.LEARNED),
        )
    )
    return sec


def _tail(curve: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    from lmedge.bench.lyreo_repro import CONVERGED_SHARE

    n = max(1, math.ceil(len(curve) * CONVERGED_SHARE))
    return list(curve[-n:])


def _curves(repro: LyreoReproduction) -> dict[str, list[dict[str, Any]]]:
    return {t.key: t.curve for t in repro.trainings}


def _fig2(repro: LyreoReproduction, series: dict[str, Any]) -> Section:
    o = repro.plan.options
    sec = Section(
        "fig2",
        "Convergence of the learned schedulers (Fig. 2)",
        lp.FIG2_REF,
        note=f"Tiny trainings on examples/lyreo (seed {o.seeds[0]}, {o.episodes} episodes of "
        f"{o.train_slots} measured slots; paper: 800-slot episodes to convergence). A curve "
        "point is an episode's mean latency per request (timeouts at τ) and mean Z; "
        "'converged' is the mean of the last third of the episodes.",
    )
    claims = (
        "LYREO < Ly-PPO < PPO in latency at convergence",
        "LYREO < Ly-PPO < PPO in Z at convergence",
    )
    if repro.training_skipped:
        sec.checks += [Check(c, lp.FIG2_REF, None, repro.training_skipped) for c in claims]
        return sec
    curves = _curves(repro)
    keys = repro.plan.curves["fig2"]
    series["fig2"] = {v: curves[k] for v, k in keys.items()}
    sec.figures.append("fig2-convergence")
    lat: dict[str, float | None] = {}
    z: dict[str, float | None] = {}
    rows = []
    for v, k in keys.items():
        tail = _tail(curves[k])
        lat[v] = mean([e["mean_latency_s"] for e in tail])
        z[v] = mean([e["mean_z"] for e in tail])
        pub = lp.FIG2[v]
        first = curves[k][0] if curves[k] else {}
        rows.append(
            (
                label(v),
                fmt(pub.latency_s, LAT),
                fmt(lat[v], LAT),
                fmt(first.get("mean_latency_s"), LAT),
                fmt(pub.z, Z),
                fmt(z[v], Z),
                len(curves[k]),
            )
        )
    sec.tables.append(
        TableData(
            "Paper vs lmedge at convergence",
            (
                "method",
                "paper latency (s)",
                "lmedge latency (s)",
                "lmedge first episode (s)",
                "paper Z",
                "lmedge Z",
                "episodes",
            ),
            tuple(rows),
        )
    )
    sec.checks.append(chain_check(claims[0], lp.FIG2_REF, lat, lp.LEARNED, LAT))
    sec.checks.append(chain_check(claims[1], lp.FIG2_REF, z, lp.LEARNED, Z))
    return sec


def _fig3(g: Cells, repro: LyreoReproduction, series: dict[str, Any]) -> Section:
    sec = Section(
        "fig3",
        "Latency and deviation of every method (Fig. 3)",
        lp.FIG3_REF,
        note="Latency quantiles over every successful request of every seed; Y: the runs' "
        "mean deviations (mean, min-max over seeds). The paper shows distributions only, so "
        "its orderings are checked, with no numbers to set beside ours."
        + _fallback_note(repro, lp.LEARNED),
        figures=["fig3-distributions"],
    )
    methods = _methods(g, "base")
    lats = {p: g.latencies("base", p) for p in methods}
    series["fig3"] = {
        p: {
            "latency_quantiles": [quantile(lats[p], q / 20) for q in range(21)],
            "deviations": g.deviations("base", p),
        }
        for p in methods
    }
    median = {p: quantile(lats[p], 0.5) for p in methods}
    dev = {p: g.balance("base", p, "mean_deviation") for p in methods}
    rows = []
    for p in methods:
        ds = g.deviations("base", p)
        rows.append(
            (
                label(p),
                fmt(median[p], LAT),
                fmt(quantile(lats[p], 0.25), LAT),
                fmt(quantile(lats[p], 0.75), LAT),
                fmt(quantile(lats[p], 0.99), LAT),
                fmt(g.balance("base", p, "mean_latency_s"), LAT),
                fmt(dev[p], DEV),
                f"{fmt(min(ds, default=None), DEV)}–{fmt(max(ds, default=None), DEV)}",
                fmt(g.balance("base", p, "mean_virtual_queue"), Z),
                pct(g.balance("base", p, "high_kv_share")),
                fmt(g.success("base", p), 3),
            )
        )
    sec.tables.append(
        TableData(
            "lmedge, mix moderate (the paper prints no values for Fig. 3)",
            (
                "method",
                "median (s)",
                "P25 (s)",
                "P75 (s)",
                "P99 (s)",
                "mean (s)",
                "Y",
                "Y min–max",
                "Z",
                "high-KV",
                "success",
            ),
            tuple(rows),
        )
    )
    ref = lp.FIG3_REF
    sec.checks.append(
        extreme_check(
            "LYREO has the lowest median latency", ref, median, "lyreo", lowest=True, digits=LAT
        )
    )
    sec.checks.append(_lowest_two(dev))
    sec.checks.append(_ppo_ahead(median, dev))
    sec.checks.append(
        chain_check(
            "Static is faster than LL (median latency)",
            ref,
            median,
            ("static-batch", lp.LEAST_LOADED),
            LAT,
        )
    )
    sec.checks.append(
        chain_check(
            "LL is better balanced than Static (Y)",
            ref,
            dev,
            (lp.LEAST_LOADED, "static-batch"),
            DEV,
        )
    )
    worst_lat = extreme_check("", ref, median, "random-request", lowest=False, digits=LAT)
    worst_dev = extreme_check("", ref, dev, "random-request", lowest=False, digits=DEV)
    both = (
        None
        if worst_lat.holds is None or worst_dev.holds is None
        else worst_lat.holds and worst_dev.holds
    )
    sec.checks.append(
        Check(
            "Random is worst on both latency and Y",
            ref,
            both,
            f"median latency: {worst_lat.reason}; Y: {worst_dev.reason}",
        )
    )
    return sec


def _lowest_two(dev: dict[str, float | None]) -> Check:
    claim, ref = "LYREO and Ly-PPO have the lowest deviations", lp.FIG3_REF
    order = ranked(dev)
    if not {"lyreo", "ly-ppo"} <= dict(order).keys() or len(order) < 3:
        return Check(claim, ref, None, "not measured: LYREO, Ly-PPO or their rivals are missing")
    third = order[2][1]
    top = {p for p, v in order[:2]}
    holds = top == {"lyreo", "ly-ppo"} and all(v < third for _, v in order[:2])
    shown = ", ".join(f"{label(p)} {v:.{DEV}f}" for p, v in order[:3])
    return Check(claim, ref, holds, "lowest three: " + shown)


def _ppo_ahead(median: dict[str, float | None], dev: dict[str, float | None]) -> Check:
    claim = "PPO is ahead of most non-learning baselines on latency and Y"
    rivals = [p for p in lp.BASELINES if median.get(p) is not None and dev.get(p) is not None]
    me_l, me_d = median.get("ppo-fixed"), dev.get("ppo-fixed")
    if me_l is None or me_d is None or not rivals:
        return Check(claim, lp.FIG3_REF, None, "not measured: PPO or the baselines are missing")
    beat_l = [p for p in rivals if me_l < (median[p] or 0)]
    beat_d = [p for p in rivals if me_d < (dev[p] or 0)]
    half = len(rivals) / 2
    return Check(
        claim,
        lp.FIG3_REF,
        len(beat_l) > half and len(beat_d) > half,
        f"PPO beats {len(beat_l)} of {len(rivals)} on median latency "
        f"({', '.join(map(label, beat_l)) or 'none'}), {len(beat_d)} of {len(rivals)} on Y "
        f"({', '.join(map(label, beat_d)) or 'none'})",
    )


def _ratio(a: float | None, b: float | None) -> float | None:
    """a / b; infinite when only b is 0, None when either is missing or both are 0."""
    if a is None or b is None or (a == 0 and b == 0):
        return None
    return math.inf if b == 0 else a / b


def _table2(g: Cells) -> Section:
    ref = lp.TABLE2_REF
    sec = Section(
        "table2",
        "Load-balancing ablation (Table II)",
        ref,
        note="Mix moderate, means over seeds. The paper's LYREO P99 and high-KV are derived "
        "from NoLB's printed changes; '–': not printed. LYREO is the `lyreo` profile (see "
        "which policy it used above).",
    )
    rows_of = ("lyreo", "lyreo-nolb", "lyreo-count")
    metrics = (
        ("mean latency (s)", "mean_latency_s", LAT),
        ("P99 latency (s)", "p99_latency_s", LAT),
        ("deviation Y", "mean_deviation", DEV),
        ("high-KV share", "high_kv_share", None),
    )
    ours = {p: {m: g.balance("base", p, m) for _, m, _ in metrics} for p in rows_of}

    def show(x: float | None, digits: int | None) -> str:
        return pct(x) if digits is None else fmt(x, digits)

    def change(a: float | None, b: float | None) -> str:
        r = _ratio(a, b)
        return "–" if r is None else ("+∞" if math.isinf(r) else f"{r - 1:+.1%}")

    paper_change = {
        "p99_latency_s": lp.NOLB_P99_INCREASE,
        "mean_deviation": lp.NOLB_DEVIATION_INCREASE,
        "high_kv_share": lp.NOLB_HIGH_KV_INCREASE,
    }
    rows = []
    for name, m, d in metrics:
        pub = {p: getattr(lp.TABLE2[p], m) for p in rows_of}
        rows.append(
            (
                name,
                *(f"{show(pub[p], d)} / {show(ours[p][m], d)}" for p in rows_of),
                f"{paper_change[m]:+.1%}" if m in paper_change else "lower",
                change(ours["lyreo-nolb"][m], ours["lyreo"][m]),
            )
        )
    sec.tables.append(
        TableData(
            "Paper / lmedge, mix moderate",
            (
                "metric",
                "LYREO",
                "LYREO-NoLB",
                "LYREO-Count",
                "paper NoLB vs LYREO",
                "lmedge NoLB vs LYREO",
            ),
            tuple(rows),
        )
    )
    ly, nolb, count = (ours[p] for p in rows_of)
    missing = {p: label(p) for p in rows_of if not g.has("base", p)}
    lo = lp.NOLB_P99_INCREASE * (1 - lp.NOLB_P99_TOLERANCE)
    hi = lp.NOLB_P99_INCREASE * (1 + lp.NOLB_P99_TOLERANCE)
    nolb_claims = (
        "NoLB lowers the mean latency",
        "NoLB's deviation is at least 2× LYREO's",
        "NoLB's high-KV share is at least 2× LYREO's",
        f"NoLB's P99 is about +80% over LYREO's (read: +{lo:.0%} to +{hi:.0%})",
    )
    gone = [missing[p] for p in ("lyreo", "lyreo-nolb") if p in missing]
    if gone:
        sec.checks += [Check(c, ref, None, f"not run: {', '.join(gone)}") for c in nolb_claims]
    else:
        sec.checks.append(
            chain_check(
                nolb_claims[0],
                ref,
                {"lyreo-nolb": nolb["mean_latency_s"], "lyreo": ly["mean_latency_s"]},
                ("lyreo-nolb", "lyreo"),
                LAT,
            )
        )
        for claim, m, d in (
            (nolb_claims[1], "mean_deviation", DEV),
            (nolb_claims[2], "high_kv_share", None),
        ):
            r = _ratio(nolb[m], ly[m])
            shown = f"NoLB {show(nolb[m], d)}, LYREO {show(ly[m], d)}"
            sec.checks.append(
                Check(
                    claim,
                    ref,
                    False if r is None else r >= 2,
                    shown + ("" if r is None else f" ({r:.2f}×)"),
                )
            )
        r = _ratio(nolb["p99_latency_s"], ly["p99_latency_s"])
        sec.checks.append(
            Check(
                nolb_claims[3],
                ref,
                None if r is None else lo <= r - 1 <= hi,
                f"NoLB {fmt(nolb['p99_latency_s'], LAT)} s, LYREO {fmt(ly['p99_latency_s'], LAT)} s"
                + ("" if r is None else f" ({r - 1:+.1%})"),
            )
        )
    claim = "Count is worse than LYREO on all four metrics"
    gone = [missing[p] for p in ("lyreo", "lyreo-count") if p in missing]
    if gone:
        sec.checks.append(Check(claim, ref, None, f"not run: {', '.join(gone)}"))
        return sec
    worse = [(name, count[m], ly[m], d) for name, m, d in metrics]
    ok = [c is not None and lyv is not None and c > lyv for _, c, lyv, _ in worse]
    sec.checks.append(
        Check(
            claim,
            ref,
            all(ok),
            "; ".join(
                f"{name}: Count {show(c, d)} vs LYREO {show(lyv, d)}" for name, c, lyv, d in worse
            ),
        )
    )
    return sec


def _axis_values(
    g: Cells, repro: LyreoReproduction, axis: str, metric: str, methods: Sequence[str]
) -> dict[str, dict[str, float | None]]:
    """{point: {method: mean over seeds of balance[metric]}}."""
    return {
        pt: {p: g.balance(key, p, metric) for p in methods if g.has(key, p)}
        for pt, key in repro.plan.axes[axis]
    }


def _every_point(
    claim: str,
    ref: str,
    per_point: dict[str, dict[str, float | None]],
    who: str,
    digits: int,
    unit: str,
) -> Check:
    """Is `who` lowest at every point of a sweep?"""
    checks = {
        pt: extreme_check(claim, ref, v, who, lowest=True, digits=digits)
        for pt, v in per_point.items()
    }
    if not checks or any(c.holds is None for c in checks.values()):
        bad = [f"{pt}: {c.reason}" for pt, c in checks.items() if c.holds is None]
        return Check(claim, ref, None, "; ".join(bad) or "no point measured")
    failed = [pt for pt, c in checks.items() if not c.holds]
    if not failed:
        return Check(
            claim,
            ref,
            True,
            f"lowest at all {len(checks)} {unit}: "
            + "; ".join(f"{pt}: {c.reason}" for pt, c in checks.items()),
        )
    return Check(claim, ref, False, "; ".join(f"{pt} {unit}: {checks[pt].reason}" for pt in failed))


def _sweep_table(
    title: str,
    axis: str,
    per_point: dict[str, dict[str, float | None]],
    methods: Sequence[str],
    digits: int,
) -> TableData:
    return TableData(
        title,
        ("method", *(f"{pt} {axis}".rstrip() for pt in per_point)),
        tuple(
            (label(p), *(fmt(per_point[pt].get(p), digits) for pt in per_point)) for p in methods
        ),
    )


def _sweep(g: Cells, repro: LyreoReproduction, axis: str, series: dict[str, Any]) -> Section:
    from lmedge.bench.lyreo_repro import SWEEP_METHODS

    users = axis == "users"
    ref = lp.FIG4_REF if users else lp.FIG5_REF
    sec = Section(
        "fig4" if users else "fig5",
        f"Scaling the {axis} (Fig. {4 if users else 5})",
        ref,
        note=(
            "Users: `workload.users.count` of examples/lyreo (8 servers, mix moderate)."
            if users
            else "Servers: examples/lyreo's `nodes` set to nodes-servers-N.yaml (near the "
            "moderate mix's 3:3:2 proportions; 8 is the scenario's own), 60 users."
        )
        + " Means over seeds; the paper prints no per-point values."
        + _fallback_note(repro, lp.LEARNED),
        figures=[f"fig{4 if users else 5}-{axis}"],
    )
    methods = [p for p in SWEEP_METHODS if any(g.has(k, p) for _, k in repro.plan.axes[axis])]
    lat = _axis_values(g, repro, axis, "mean_latency_s", methods)
    dev = _axis_values(g, repro, axis, "mean_deviation", methods)
    ok = {
        pt: {p: g.success(key, p) for p in methods if g.has(key, p)}
        for pt, key in repro.plan.axes[axis]
    }
    series[f"fig{4 if users else 5}"] = {"points": list(lat), "latency": lat, "deviation": dev}
    sec.tables.append(_sweep_table("lmedge mean latency (s)", axis, lat, methods, LAT))
    sec.tables.append(_sweep_table("lmedge deviation Y", axis, dev, methods, DEV))
    sec.tables.append(_sweep_table("lmedge success ratio", axis, ok, methods, 3))
    past = [
        pt
        for pt, v in ok.items()
        if any(x is not None and x < PAST_CAPACITY_SUCCESS for x in v.values())
    ]
    lowest = _every_point(
        f"LYREO has the lowest latency at every {axis[:-1]} count", ref, lat, "lyreo", LAT, axis
    )
    if past:
        where = f"{', '.join(past)} {axis}"
        sec.note += (
            f" Past the cluster's capacity at {where} (a method's success ratio below "
            f"{PAST_CAPACITY_SUCCESS}): requests time out there, and a mean latency is over those "
            "that finished, which favours a method that lets more of them time out "
            "(examples/lyreo/README.md, Overload)."
        )
        lowest = replace(
            lowest, reason=f"{lowest.reason} (past capacity at {where}: means over successes)"
        )
    sec.checks.append(lowest)
    sec.checks.append(
        _every_point(
            f"LYREO has the lowest deviation at every {axis[:-1]} count",
            ref,
            dev,
            "lyreo",
            DEV,
            axis,
        )
    )
    if users:
        reds = {pt: reduction(v.get("lyreo"), v.get("ly-ppo")) for pt, v in lat.items()}
        got = mean(list(reds.values()))
        tol = lp.USERS_REDUCTION_TOLERANCE
        target = lp.USERS_REDUCTION_VS_LY_PPO
        sec.checks.append(
            Check(
                f"LYREO's latency is about {target:.0%} below Ly-PPO's on average over user counts "
                f"(read: within ±{tol:.0%})",
                ref,
                None if got is None else abs(got - target) <= tol,
                "not measured: LYREO or Ly-PPO missing"
                if got is None
                else f"mean reduction {got:.1%} ("
                + ", ".join(f"{pt}: {pct(r)}" for pt, r in reds.items())
                + ")"
                + _fallback_note(repro, ("lyreo", "ly-ppo")),
            )
        )
    else:
        sec.checks.append(_falls(lat, "latency falls with more servers for every method", ref))
    return sec


def _monotone(values: Sequence[float | None], *, rising: bool) -> bool:
    """Strictly rising (or falling) from one point to the next; False if one is missing."""
    vs = [v for v in values if v is not None]
    if len(vs) < len(values):
        return False
    return all((a < b) if rising else (a > b) for a, b in itertools.pairwise(vs))


def _falls(per_point: dict[str, dict[str, float | None]], claim: str, ref: str) -> Check:
    pts = list(per_point)
    methods = {p for v in per_point.values() for p in v}
    if len(pts) < 2 or not methods:
        return Check(claim, ref, None, "fewer than two points measured")
    bad = []
    for p in sorted(methods):
        vs = [per_point[pt].get(p) for pt in pts]
        if not _monotone(vs, rising=False):
            bad.append(f"{label(p)} " + " → ".join(fmt(v, LAT) for v in vs))
    return Check(
        claim,
        ref,
        not bad,
        "; ".join(bad) if bad else f"falls for all {len(methods)} methods over {', '.join(pts)}",
    )


def _fig6(g: Cells, repro: LyreoReproduction, series: dict[str, Any]) -> Section:
    ref = lp.FIG6_REF
    sec = Section(
        "fig6",
        "Hardware heterogeneity (Fig. 6)",
        ref,
        note="Mixes of examples/lyreo: homogeneous (8× 3090), moderate (3× 3080, 3× 3090, "
        "2× 4090), heterogeneous (4× 3080, 1× 3090, 3× 4090); means over seeds."
        + _fallback_note(repro, lp.LEARNED),
        figures=["fig6-heterogeneity"],
    )
    methods = [p for p in lp.METHODS if any(g.has(k, p) for _, k in repro.plan.axes["mix"])]
    dev = _axis_values(g, repro, "mix", "mean_deviation", methods)
    lat = _axis_values(g, repro, "mix", "mean_latency_s", methods)
    series["fig6"] = {"mixes": list(dev), "deviation": dev}
    sec.tables.append(_sweep_table("lmedge deviation Y", "", dev, methods, DEV))
    sec.tables.append(_sweep_table("lmedge mean latency (s)", "", lat, methods, LAT))
    claim = "deviation rises from homogeneous to moderate to heterogeneous for every method"
    per_method = {p: {mix: dev[mix].get(p) for mix in dev} for p in methods}
    bad, missing = [], []
    for p, vs in per_method.items():
        chain = list(vs.values())
        if len(chain) < 2 or any(v is None for v in chain):
            missing.append(label(p))
        elif not _monotone(chain, rising=True):
            bad.append(f"{label(p)} " + " → ".join(fmt(v, DEV) for v in chain))
    if not per_method or missing:
        sec.checks.append(
            Check(claim, ref, None, "not measured: " + (", ".join(missing) or "no method"))
        )
    else:
        sec.checks.append(
            Check(
                claim,
                ref,
                not bad,
                "; ".join(bad) if bad else f"rises for all {len(per_method)} methods",
            )
        )
    sec.checks.append(
        _every_point("LYREO has the lowest deviation in every mix", ref, dev, "lyreo", DEV, "mix")
    )
    return sec


def _fig7(g: Cells, repro: LyreoReproduction, series: dict[str, Any]) -> Section:
    ref = lp.FIG7_REF
    o = repro.plan.options
    sec = Section(
        "fig7",
        "Sensitivity to ν and H (Fig. 7)",
        ref,
        note="(a) `lyreo` with the router parameter nu, mix moderate, means over seeds"
        + _fallback_note(repro, ("lyreo",))
        + f". (b) tiny lyreo trainings (seed {o.seeds[0]}, {o.episodes} episodes of "
        f"{o.train_slots} slots) at each truncation H: final latency and Z (mean of the last "
        "third of the episodes) and the spread of those episodes' latencies.",
    )
    pts = repro.plan.axes["nu"]
    if pts or (repro.plan.curves["h"] and not repro.training_skipped):
        sec.figures.append("fig7-sensitivity")
    nu_rows = []
    lat: dict[float, float | None] = {}
    dev: dict[float, float | None] = {}
    for pt, key in pts:
        nu = float(pt)
        lat[nu] = g.balance(key, "lyreo", "mean_latency_s")
        dev[nu] = g.balance(key, "lyreo", "mean_deviation")
        nu_rows.append(
            (
                pt,
                fmt(lp.NU_LATENCY_S.get(nu), 1),
                fmt(lat[nu], LAT),
                fmt(g.balance(key, "lyreo", "p99_latency_s"), LAT),
                fmt(dev[nu], DEV),
                fmt(g.balance(key, "lyreo", "mean_virtual_queue"), Z),
            )
        )
    series["fig7_nu"] = {
        "nu": [float(p) for p, _ in pts],
        "latency": list(lat.values()),
        "deviation": list(dev.values()),
    }
    sec.tables.append(
        TableData(
            "(a) ν: paper / lmedge",
            (
                "ν",
                "paper latency (s)",
                "lmedge latency (s)",
                "lmedge P99 (s)",
                "lmedge Y",
                "lmedge Z",
            ),
            tuple(nu_rows),
        )
    )
    measured = {nu: v for nu, v in lat.items() if v is not None}
    claim = "latency falls as ν goes from 0.05 to 2"
    if len(measured) < 2:
        sec.checks.append(Check(claim, ref, None, "fewer than two ν measured"))
    else:
        a, b = min(measured), max(measured)
        sec.checks.append(
            Check(
                claim,
                ref,
                measured[b] < measured[a],
                f"ν {a:g}: {measured[a]:.{LAT}f} s → ν {b:g}: {measured[b]:.{LAT}f} s"
                + _fallback_note(repro, ("lyreo",)),
            )
        )
    claim = f"deviation rises past ν = {lp.NU_KNEE:g}"
    devs = {nu: v for nu, v in dev.items() if v is not None}
    below = [nu for nu in devs if nu <= lp.NU_KNEE]
    above = [nu for nu in devs if nu > lp.NU_KNEE]
    if not below or not above:
        sec.checks.append(
            Check(claim, ref, None, f"needs a ν at or below {lp.NU_KNEE:g} and one above")
        )
    else:
        k, top = max(below), max(above)
        sec.checks.append(
            Check(
                claim,
                ref,
                devs[top] > devs[k],
                f"Y at ν {k:g}: {devs[k]:.{DEV}f} → ν {top:g}: {devs[top]:.{DEV}f}",
            )
        )
    check, table = _horizon(repro, series)
    if table is not None:
        sec.tables.append(table)
    sec.checks.append(check)
    return sec


def _horizon(repro: LyreoReproduction, series: dict[str, Any]) -> tuple[Check, TableData | None]:
    """Fig. 7b's check, and its table when the trainings ran."""
    claim = f"gains of H flatten past {lp.H_KNEE} (the gain past it at most half the gain up to it)"
    ref = lp.FIG7_REF
    if repro.training_skipped:
        return Check(claim, ref, None, repro.training_skipped), None
    curves = _curves(repro)
    final: dict[int, float | None] = {}
    rows = []
    for h, key in repro.plan.curves["h"].items():
        tail = _tail(curves[key])
        lats = [e["mean_latency_s"] for e in tail]
        final[int(h)] = mean(lats)
        spread = (max(lats) - min(lats)) if lats else None
        rows.append(
            (
                h,
                fmt(final[int(h)], LAT),
                fmt(mean([e["mean_z"] for e in tail]), Z),
                fmt(spread, LAT),
            )
        )
    series["fig7_h"] = {h: curves[k] for h, k in repro.plan.curves["h"].items()}
    table = TableData(
        "(b) H: lmedge (the paper shows curves only)",
        ("H", "final latency (s)", "final Z", "latency spread (s)"),
        tuple(rows),
    )
    lo = [h for h in final if h < lp.H_KNEE]
    hi = [h for h in final if h > lp.H_KNEE]
    if lp.H_KNEE not in final or not lo or not hi:
        why = f"needs H below {lp.H_KNEE}, H = {lp.H_KNEE} and H above"
        return Check(claim, ref, None, why), table
    a, k, b = final[min(lo)], final[lp.H_KNEE], final[max(hi)]
    if a is None or k is None or b is None:
        return Check(claim, ref, None, "a training has no curve"), table
    before, after = a - k, k - b
    return Check(
        claim,
        ref,
        before > 0 and after <= before / 2,
        f"H {min(lo)}: {a:.{LAT}f} s, H {lp.H_KNEE}: {k:.{LAT}f} s, H {max(hi)}: {b:.{LAT}f} s "
        f"(gain up to {lp.H_KNEE}: {before:+.{LAT}f} s, past it: {after:+.{LAT}f} s)",
    ), table
