"""Calibration: service-rate estimation, J_cal pieces, the coordinate search, and the CLI."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path

import pytest

from lmedge.api import InstanceState, LMPlacement, NodeState, Placement, RequestRecord, Snapshot
from lmedge.policies.lyapunov.calibration import (
    calibration_objective,
    coordinate_search,
    flips_per_decision,
    service_rates,
)


def rec(lm: str, mode: str, done: int, ok: bool = True, latency: float = 90.0) -> RequestRecord:
    return RequestRecord(
        id=f"{lm}-{mode}-{done}-{latency}",
        lm=lm,
        origin="w",
        destination="w",
        prompts=done,
        prompts_done=done,
        slot=0,
        submit_s=0,
        inference_s=latency,
        outcome="success" if ok else "timeout",
        mode=mode,  # type: ignore[arg-type]
    )


def snap(
    slot: int, backlog: dict[str, int], instances: dict[str, str], status: str = "ready"
) -> Snapshot:
    inst = [
        InstanceState(lm=lm, mode=m, cpu_cores=4, vgpus=1 if m == "gpu" else 0, status=status)  # type: ignore[arg-type]
        for lm, m in instances.items()
    ]
    return Snapshot(
        slot=slot, time_s=slot * 30.0, nodes=[NodeState(name="w", backlog=backlog, instances=inst)]
    )


def test_service_rates_follow_the_papers_formula() -> None:
    records = [
        rec("lm1", "gpu", 6),
        rec("lm1", "gpu", 6),
        rec("lm1", "cpu", 4),
        rec("lm4", "none", 0),
    ]
    snaps = [
        snap(0, {"lm1": 3}, {"lm1": "gpu"}),
        snap(1, {"lm1": 5}, {"lm1": "gpu"}),
        snap(2, {"lm1": 0}, {"lm1": "gpu"}),  # idle: not busy time
        snap(3, {"lm1": 2}, {"lm1": "cpu"}),
        snap(4, {"lm1": 2}, {"lm1": "cpu"}, status="pending"),  # cold start: not serving
    ]
    rates = service_rates(records, snaps, 30.0)
    assert rates.busy_s == {("lm1", "gpu"): 60.0, ("lm1", "cpu"): 30.0}
    assert rates.alpha_gpu == {"lm1": pytest.approx(30 * 12 / 60)}
    assert rates.alpha_cpu == {"lm1": pytest.approx(30 * 4 / 30)}


def place(node: str, active: list[str]) -> Placement:
    return Placement(
        node=node,
        lms=[
            LMPlacement(
                lm=lm,
                mode="cpu" if lm in active else "off",
                cpu_cores=4 if lm in active else 0,
                vgpus=0,
            )
            for lm in ("lm1", "lm2")
        ],
    )


@pytest.mark.parametrize(
    ("sequence", "expected"),
    [
        ([place("a", ["lm1"]), place("a", ["lm1"])], 0.0),
        ([place("a", ["lm1"]), place("a", ["lm2"])], 2.0),
        ([place("a", []), place("b", ["lm1"]), place("a", ["lm1"]), place("b", ["lm1"])], 0.5),
    ],
    ids=["steady", "swap-counts-two", "per-node-history"],
)
def test_flips_per_decision(sequence: list[Placement], expected: float) -> None:
    assert flips_per_decision(sequence) == pytest.approx(expected)


def test_objective_counts_timeouts_at_tau_and_unfairness() -> None:
    fair = [rec("lm1", "gpu", 1, latency=90.0), rec("lm2", "gpu", 1, latency=90.0)]
    assert calibration_objective(fair, [], ["lm1", "lm2"], 900.0) == pytest.approx(0.1)
    unfair = [rec("lm1", "gpu", 1, latency=90.0), rec("lm2", "gpu", 1, ok=False)]
    # latency (90 + 900) / 2 / 900 = 0.55; Jain of (1, 0) = 0.5
    assert calibration_objective(unfair, [], ["lm1", "lm2"], 900.0) == pytest.approx(0.55 + 0.5)
    assert calibration_objective([], [], ["lm1"], 900.0) == math.inf


def bowl(target: Mapping[str, float]):  # type: ignore[no-untyped-def]
    def j(x: Mapping[str, float]) -> float:
        return sum((math.log(x[k]) - math.log(target[k])) ** 2 for k in target)

    return j


def test_search_walks_towards_the_optimum_in_log_space() -> None:
    target = {"p1": 0.25, "p2": 0.25, "lambda_churn": 4.0, "kappa": 1.0}
    result = coordinate_search(
        bowl(target), dict.fromkeys(target, 1.0), radii=(2.0, 2.0), eps_acc=0.0
    )
    assert result.final == {"p1": 0.25, "p2": 0.25, "lambda_churn": 4.0, "kappa": 1.0}
    assert [s.accepted for s in result.steps[:4]] == ["down", "down", "up", "keep"]
    assert result.j_final < result.j_start


def test_acceptance_margin_keeps_small_improvements_out() -> None:
    target = {"p1": 1.1, "p2": 1.0, "lambda_churn": 1.0, "kappa": 1.0}
    result = coordinate_search(bowl(target), dict.fromkeys(target, 1.0), radii=(1.2,), eps_acc=0.05)
    assert result.final == dict.fromkeys(target, 1.0)
    assert all(s.accepted == "keep" for s in result.steps)
    assert result.evaluations == 1 + 2 * 4


@pytest.mark.slow
def test_calibrate_cli_prints_trajectory_and_writes_params(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from lmedge.cli import app
    from lmedge.cli.calibrate import register

    register(app)
    out = tmp_path / "cal.json"
    res = CliRunner().invoke(
        app,
        [
            "calibrate",
            "-f",
            "testbed",
            "--rate-slots",
            "4",
            "--window-slots",
            "2",
            "--radii",
            "2",
            "-o",
            str(out),
        ],
    )
    assert res.exit_code == 0, res.output
    assert "coordinate search" in res.output and "coefficients:" in res.output
    payload = json.loads(out.read_text())
    assert set(payload["deployer_params"]) >= {
        "p0",
        "p1",
        "p2",
        "lambda_churn",
        "kappa",
        "alpha_gpu",
    }
    assert len(payload["trajectory"]) == 4
