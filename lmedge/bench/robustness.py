"""The robustness bench: every profile on generated scenarios, ranked case by case.

`lmedge bench --generated N --from K --seeds 1,2` draws scenarios `gen-K` ..
`gen-(K+N-1)` (`lmedge.sim.generator`), runs every profile on each with each
seed, and scores each profile against the best profile *of the same scenario
and seed* (a case):

- J (lower is better): win rate (its J is the case's best), the share of
  cases within 5% of the best, and the median and worst of J / best J;
- penalized LM-mean latency (lower is better): the unweighted mean over LMs of
  each LM's mean latency with every request that did not succeed (rejected,
  timed out, lost) counted at its deadline tau, so refusing work never looks
  faster than serving it; the same four figures;
- success ratio (higher is better): the same four figures, the ratio being
  best success / its success (>= 1, like the others);
- how often each of the MA paper's Fig. 6 orderings holds
  (`lmedge.bench.evaluation.fig6_checks`), per case, on the paper's methods;
- the scenarios where `ma` is worse than `mal` by J on every seed (beyond the
  seeds' spread): the two differ only in the deployer.

Pure: it reads summaries and writes no runs; the CLI runs them.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmedge.bench import paper
from lmedge.bench.evaluation import fig6_checks
from lmedge.sim.generator import Bounds, generate

Summary = dict[str, Any]

#: "Within 5% of the best": the issue's bar for the default profile.
NEAR = 1.05
#: A best value at or below this counts as this (a J or latency of 0 has no ratio).
FLOOR = 1e-9
#: Generator sizes of the bench: small enough that N = 50 x 2 seeds x 11 profiles
#: fits 30 minutes on 2 cores (bench README), within the generator's documented ranges.
BENCH_BOUNDS = Bounds(min_workers=4, max_workers=12, max_sites=4, min_lms=3, max_lms=8, slots=60)


def write_scenarios(
    first: int, count: int, folder: Path, pool: Sequence[dict[str, Any]], bounds: Bounds
) -> list[Path]:
    """Generate `gen-first` .. `gen-(first+count-1)` under `folder`; their paths."""
    out = []
    for seed in range(first, first + count):
        scenario = generate(seed, pool, bounds)
        out.append(scenario.write(folder / scenario.name))
    return out


@dataclass(frozen=True)
class _Metric:
    key: str
    label: str
    lower_is_better: bool


METRICS = (
    _Metric("objective", "J", True),
    _Metric("penalized_latency", "penalized LM-mean latency", True),
    _Metric("success", "success", False),
)


def _values(s: Summary) -> dict[str, float | None]:
    return {
        "objective": s["objective"],
        # every failed request at its LM's deadline (`lmedge.metrics.penalized_latency`)
        "penalized_latency": s["lm_mean_penalized_latency_s"],
        "success": s["success_ratio"],
    }


def _ratio(value: float, best: float, lower_is_better: bool) -> float:
    if lower_is_better:
        return max(value, FLOOR) / max(best, FLOOR)
    return max(best, FLOOR) / max(value, FLOOR)


def score(summaries: Sequence[Summary]) -> dict[str, Any]:
    """The bench's payload: per-profile scores, ordering counts and every case's values.

    A case is a (scenario, seed)
    pair; a profile missing a value in a case is left out of that case.
    """
    cases: dict[tuple[str, int], dict[str, Summary]] = {}
    for s in summaries:
        cases.setdefault((s["scenario"], s["seed"]), {})[s["policy"]] = s
    profiles = list(dict.fromkeys(s["policy"] for s in summaries))
    ratios: dict[str, dict[str, list[tuple[float, str]]]] = {
        p: {m.key: [] for m in METRICS} for p in profiles
    }
    ordering: dict[str, dict[str, Any]] = {}
    rows = []
    for (scenario, seed), by in sorted(cases.items()):
        case = f"{scenario} s{seed}"
        vals = {p: _values(s) for p, s in by.items()}
        for m in METRICS:
            have = {p: v[m.key] for p, v in vals.items() if v[m.key] is not None}
            if not have:
                continue
            pick = min if m.lower_is_better else max
            best = pick(x for x in have.values() if x is not None)
            for p, x in have.items():
                assert x is not None
                ratios[p][m.key].append((_ratio(x, best, m.lower_is_better), case))
        methods = [p for p in paper.METHODS if p in by]
        lat = {p: by[p].get("lm_mean_latency_s") for p in methods}
        jain = {p: by[p].get("window_mean_jain") for p in methods}
        for check in fig6_checks(lat, jain):
            c = ordering.setdefault(check.claim, {"claim": check.claim, "holds": 0, "measured": 0})
            if check.holds is not None:
                c["measured"] += 1
                c["holds"] += int(check.holds)
        rows.append(
            {
                "scenario": scenario,
                "seed": seed,
                "values": {
                    p: {k: None if x is None else round(x, 6) for k, x in v.items()}
                    for p, v in vals.items()
                },
            }
        )
    table = {p: {m.key: _summary(ratios[p][m.key]) for m in METRICS} for p in profiles}
    return {
        "cases": len(cases),
        "scenarios": sorted({sc for sc, _ in cases}),
        "seeds": sorted({seed for _, seed in cases}),
        "near": NEAR,
        "profiles": table,
        "orderings": list(ordering.values()),
        "worse_beyond_seeds": [
            _worse_beyond_seeds(cases, a, b) for a, b in PAIRS if {a, b} <= set(profiles)
        ],
        "per_case": rows,
    }


#: (profile, rival): the scenarios where the profile's J is above the rival's on every seed.
PAIRS = (("ma", "mal"),)


def _worse_beyond_seeds(
    cases: Mapping[tuple[str, int], Mapping[str, Summary]], a: str, b: str
) -> dict[str, Any]:
    """Scenarios where `a`'s best J over the seeds is above `b`'s worst: worse beyond the
    seeds' spread (with one seed, simply worse)."""
    js: dict[str, dict[str, list[float]]] = {}
    for (scenario, _), by in cases.items():
        if a in by and b in by:
            per = js.setdefault(scenario, {a: [], b: []})
            per[a].append(by[a]["objective"])
            per[b].append(by[b]["objective"])
    worse = sorted(sc for sc, per in js.items() if min(per[a]) > max(per[b]))
    return {"profile": a, "rival": b, "scenarios": len(js), "worse": worse}


def _summary(xs: list[tuple[float, str]]) -> dict[str, Any]:
    if not xs:
        return {"cases": 0}
    values = [x for x, _ in xs]
    worst, where = max(xs)
    return {
        "cases": len(xs),
        "wins": round(sum(x <= 1 + 1e-9 for x in values) / len(xs), 4),
        "within_near": round(sum(x <= NEAR for x in values) / len(xs), 4),
        "median_ratio": round(statistics.median(values), 4),
        "worst_ratio": round(worst, 4),
        "worst_case": where,
    }


def markdown(payload: Mapping[str, Any]) -> str:
    """The report: one row per profile, then the orderings."""
    near = f"≤{round((payload['near'] - 1) * 100)}%"
    head = [
        f"# Robustness bench: {payload['cases']} cases "
        f"({len(payload['scenarios'])} generated scenarios x seeds "
        f"{','.join(map(str, payload['seeds']))})",
        "",
        "Each ratio is to the best profile of the same scenario and seed (1 = the best); "
        "success's is best / its. Penalized latency counts every failed request at tau.",
        "",
    ]
    cols = ["profile"]
    for m in METRICS:
        cols += [f"{m.label} wins", f"{m.label} {near}", f"{m.label} median", f"{m.label} worst"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for p, by in payload["profiles"].items():
        cells = [p]
        for m in METRICS:
            s = by[m.key]
            if not s.get("cases"):
                cells += ["–"] * 4
                continue
            cells += [
                f"{s['wins']:.0%}",
                f"{s['within_near']:.0%}",
                f"{s['median_ratio']:.2f}",
                f"{s['worst_ratio']:.2f}",
            ]
        lines.append("| " + " | ".join(cells) + " |")
    orders = ["", "| the paper's ordering (Fig. 6) | holds | of cases measured |", "|---|---|---|"]
    for o in payload["orderings"]:
        share = f"{o['holds'] / o['measured']:.0%}" if o["measured"] else "–"
        orders.append(f"| {o['claim']} | {share} | {o['holds']} / {o['measured']} |")
    pairs = [""]
    for w in payload.get("worse_beyond_seeds", []):
        pairs.append(
            f"`{w['profile']}` worse than `{w['rival']}` by J on every seed: "
            f"{len(w['worse'])} of {w['scenarios']} scenarios"
            + (f" ({', '.join(w['worse'])})" if w["worse"] else "")
        )
    return "\n".join(head + lines + orders + pairs) + "\n"


def write(folder: Path, payload: Mapping[str, Any]) -> Path:
    """`robustness.md` and `robustness.json` in `folder`; the markdown's path."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "robustness.json").write_text(json.dumps(payload, indent=1, sort_keys=True) + "\n")
    md = folder / "robustness.md"
    md.write_text(markdown(payload))
    return md
