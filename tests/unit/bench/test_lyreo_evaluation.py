"""LYREO's orderings are computed from the numbers: each verdict flips when its numbers do.

Synthetic runs (a summary's `balance` and a few request latencies per cell and
method) and training curves stand in for the grid; each case sets the numbers
so that one ordering of the paper holds, then changes one number so that it
does not.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from lmedge.bench import lyreo_paper as lp
from lmedge.bench.checks import Check, Section, label
from lmedge.bench.lyreo_evaluation import evaluate
from lmedge.bench.lyreo_repro import LyreoOptions, LyreoReproduction, Plan, TrainingRun
from lmedge.bench.runner import RequestTable, RunData, RunSpec
from lmedge.controller.assembly import PolicyChoice

Values = dict[tuple[str, str], dict[str, float]]

AXES = {
    "mix": [("homogeneous", "mix-homogeneous"), ("moderate", "base"), ("heterogeneous", "mix-h")],
    "users": [("30", "users-30"), ("60", "base")],
    "servers": [("6", "servers-6"), ("8", "base")],
    "nu": [("0.05", "nu-0.05"), ("2", "nu-2")],
}
CURVES = {
    "fig2": {v: f"fig2-{v}" for v in lp.LEARNED},
    "h": {"50": "h-50", "250": "fig2-lyreo", "300": "h-300"},
}


def _base() -> Values:
    """Every method on every cell, with LYREO best everywhere and the paper's orderings."""
    rank = {p: i for i, p in enumerate(lp.METHODS)}
    out: Values = {}
    for axis in AXES.values():
        for k, (_, cell) in enumerate(axis):
            for p in lp.METHODS:
                r = rank[p] + 1
                out[(cell, p)] = {
                    "mean_latency_s": 2.0 + r / 10 - k / 100,
                    "p99_latency_s": 4.0 + r / 10,
                    "mean_deviation": 0.001 * r + 0.0001 * k,
                    "mean_virtual_queue": 0.0,
                    "high_kv_share": 0.01 * r,
                }
    return out


def _run(cell: str, policy: str, v: dict[str, float]) -> tuple[str, RunData]:
    lat = v["mean_latency_s"]
    n = 5
    requests = RequestTable(
        0.5, ("m",), (0,) * n, (0,) * n, (1,) * n, (True,) * n, (lat,) * n, (30.0,) * n
    )
    balance = {k: x for k, x in v.items() if k != "success_ratio"}
    ok = v.get("success_ratio", 1.0)
    summary = {"policy": policy, "seed": 1, "success_ratio": ok, "balance": balance}
    spec = RunSpec(Path("lyreo"), PolicyChoice(policy), 1, 10)
    return cell, RunData(spec, summary, requests, {"cpu_s": 0.0})


def _curve(latency: float, z: float) -> list[dict[str, Any]]:
    return [
        {"episode": k, "seed": k, "mean_latency_s": latency, "failure_share": 0.0,
         "mean_z": z, "mean_cost": 0.0, "decisions": 10}
        for k in range(3)
    ]  # fmt: skip


def _curves() -> dict[str, list[dict[str, Any]]]:
    return {
        "fig2-lyreo": _curve(2.4, 0.02),
        "fig2-ly-ppo": _curve(3.9, 0.09),
        "fig2-ppo-fixed": _curve(5.2, 0.22),
        "h-50": _curve(3.0, 0.0),
        "h-300": _curve(2.35, 0.0),
    }


def _sections(
    values: Values, curves: dict[str, list[dict[str, Any]]], skipped: str | None = None
) -> list[Section]:
    plan = Plan(LyreoOptions(seeds=(1,)), [], [], AXES, CURVES)
    runs = [_run(cell, p, v) for (cell, p), v in values.items()]
    trainings = [] if skipped else [TrainingRun(k, c, {}) for k, c in curves.items()]
    shipped = {p: "shipped" for p in lp.LEARNED}
    repro = LyreoReproduction(plan, runs, trainings, skipped, shipped)
    sections, _ = evaluate(repro)
    return sections


def _verdicts(
    values: Values, curves: dict[str, list[dict[str, Any]]], skipped: str | None = None
) -> dict[str, Check]:
    return {c.claim: c for s in _sections(values, curves, skipped) for c in s.checks}


def _find(checks: dict[str, Check], part: str) -> Check:
    (claim,) = [c for c in checks if part in c]
    return checks[claim]


def _set(cell: str, policy: str, key: str, value: float) -> Callable[[Values], None]:
    def change(v: Values) -> None:
        v[(cell, policy)][key] = value

    return change


def _nolb(v: Values) -> None:  # NoLB: faster, twice as unbalanced and full, P99 +80%
    ly, nolb = v[("base", "lyreo")], v[("base", "lyreo-nolb")]
    nolb.update(
        mean_latency_s=ly["mean_latency_s"] - 0.05,
        mean_deviation=2.5 * ly["mean_deviation"],
        high_kv_share=2.5 * ly["high_kv_share"],
        p99_latency_s=1.8 * ly["p99_latency_s"],
    )


def _as_is(v: Values) -> None:  # `_base` already has the ordering
    pass


def _ll_balanced(v: Values) -> None:
    v[("base", "ll-kv")]["mean_deviation"] = 0.005  # Static: 0.0071


def _nu_trade(v: Values) -> None:
    v[("nu-0.05", "lyreo")].update(mean_latency_s=5.6, mean_deviation=0.001)
    v[("nu-2", "lyreo")].update(mean_latency_s=2.1, mean_deviation=0.004)


CASES: list[tuple[str, Callable[[Values], None], Callable[[Values], None]]] = [
    ("NoLB's deviation", _nolb, _set("base", "lyreo-nolb", "mean_deviation", 0.0015)),
    ("NoLB's high-KV share", _nolb, _set("base", "lyreo-nolb", "high_kv_share", 0.015)),
    ("NoLB's P99 is about +80%", _nolb, _set("base", "lyreo-nolb", "p99_latency_s", 4.2)),
    ("NoLB lowers the mean latency", _nolb, _set("base", "lyreo-nolb", "mean_latency_s", 2.5)),
    ("Count is worse than LYREO", _as_is, _set("base", "lyreo-count", "high_kv_share", 0.001)),
    ("Static is faster than LL", _as_is, _set("base", "static-batch", "mean_latency_s", 3)),
    ("LL is better balanced", _ll_balanced, _set("base", "ll-kv", "mean_deviation", 0.05)),
    ("Random is worst on both", _as_is, _set("base", "random-request", "mean_deviation", 0)),
    ("LYREO has the lowest median", _as_is, _set("base", "lyreo", "mean_latency_s", 2.5)),
    ("LYREO and Ly-PPO have the lowest", _as_is, _set("base", "ly-ppo", "mean_deviation", 0.05)),
    ("latency at every user", _as_is, _set("users-30", "lyreo", "mean_latency_s", 9)),
    ("deviation in every mix", _as_is, _set("mix-h", "lyreo", "mean_deviation", 1)),
    ("deviation rises from homogeneous", _as_is, _set("mix-h", "ll-kv", "mean_deviation", 0)),
    ("falls with more servers", _as_is, _set("base", "random-request", "mean_latency_s", 9)),
    ("latency falls as ν", _nu_trade, _set("nu-2", "lyreo", "mean_latency_s", 6)),
    ("deviation rises past ν", _nu_trade, _set("nu-2", "lyreo", "mean_deviation", 0.0005)),
]  # fmt: skip


@pytest.mark.parametrize(("claim", "holds", "breaks"), CASES, ids=[c[0] for c in CASES])
def test_a_run_ordering_follows_its_numbers(
    claim: str, holds: Callable[[Values], None], breaks: Callable[[Values], None]
) -> None:
    values = _base()
    holds(values)
    before = _find(_verdicts(values, _curves()), claim)
    breaks(values)
    after = _find(_verdicts(values, _curves()), claim)
    assert (before.holds, after.holds) == (True, False), (before.reason, after.reason)
    assert before.reason != after.reason  # the reason shows the numbers that changed


def _swap(a: str, b: str) -> Callable[[dict[str, list[dict[str, Any]]]], None]:
    def change(c: dict[str, list[dict[str, Any]]]) -> None:
        c[a], c[b] = c[b], c[a]

    return change


TRAINED = [
    ("LYREO < Ly-PPO < PPO in latency", _swap("fig2-lyreo", "fig2-ly-ppo")),
    ("LYREO < Ly-PPO < PPO in Z", _swap("fig2-ly-ppo", "fig2-ppo-fixed")),
    ("gains of H flatten", lambda c: c.update({"h-300": _curve(1.0, 0.0)})),
]


@pytest.mark.parametrize(("claim", "breaks"), TRAINED, ids=[t[0] for t in TRAINED])
def test_a_training_ordering_follows_its_curves(
    claim: str, breaks: Callable[[dict[str, list[dict[str, Any]]]], None]
) -> None:
    curves = _curves()
    before = _find(_verdicts(_base(), curves), claim)
    breaks(curves)
    after = _find(_verdicts(_base(), curves), claim)
    assert (before.holds, after.holds) == (True, False), (before.reason, after.reason)


def test_without_torch_the_training_checks_are_not_evaluated_and_say_why() -> None:
    why = "torch is not installed"
    checks = _verdicts(_base(), {}, skipped=why)
    for claim in ("LYREO < Ly-PPO < PPO in latency", "gains of H flatten"):
        c = _find(checks, claim)
        assert (c.holds, c.reason) == (None, why)
    assert _find(checks, "LYREO has the lowest median").holds is not None  # runs still count


def test_a_missing_method_is_not_evaluated_rather_than_failed() -> None:
    values = {k: v for k, v in _base().items() if k[1] != "lyreo-nolb"}
    c = _find(_verdicts(values, _curves()), "NoLB's deviation is at least 2×")
    assert c.holds is None
    assert "LYREO-NoLB" in c.reason


def test_a_sweep_point_past_capacity_shows_its_success_ratios_and_is_named() -> None:
    """Past capacity requests time out, and a mean over the finished ones favours a method
    that lets more of them time out: the sweep says where, beside the latencies."""
    values = _base()
    values[("users-30", "static-batch")]["success_ratio"] = 0.58
    (fig4,) = [s for s in _sections(values, _curves()) if s.key == "fig4"]
    (ok,) = [t for t in fig4.tables if t.title == "lmedge success ratio"]
    static = next(row for row in ok.rows if row[0] == label("static-batch"))
    assert static[1:] == ("0.580", "1.000")
    assert "Past the cluster's capacity at 30 users" in fig4.note
    lowest = _find({c.claim: c for c in fig4.checks}, "lowest latency at every user count")
    assert "past capacity at 30 users" in lowest.reason
    (fig5,) = [s for s in _sections(_base(), _curves()) if s.key == "fig5"]
    assert "capacity" not in fig5.note  # every method finished everything
