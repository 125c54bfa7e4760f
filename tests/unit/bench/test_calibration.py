"""The calibration check's facts, measured on hand-made requests (no emulator runs)."""

from __future__ import annotations

import pytest

from lmedge.api import ClusterContext
from lmedge.bench.calibration import FACTS, Fact, Measured, Request, Row, paper_lm


def fact(key: str) -> Fact:
    return next(f for f in FACTS if f.key == key)


def measured(policy: str, requests: list[Request], seeds: tuple[int, ...] = (1,)) -> Measured:
    return Measured(policy, 10, seeds, tuple(requests))


def runs(**by_name: list[Request]) -> dict[str, Measured]:
    empty: list[Request] = []
    names = ("pre", "rr", "milp", "ma")
    return {n: measured(n, by_name.get(n, empty)) for n in names}


def test_paper_lms_are_found_by_model_id(ctx: ClusterContext) -> None:
    assert [paper_lm(ctx, f"LM{i}") for i in range(1, 5)] == ["lm1", "lm2", "lm3", "lm4"]
    other = ctx.model_copy(
        update={
            "services": [
                s.model_copy(update={"spec": s.spec.model_copy(update={"model": "llama"})})
                if s.name == "lm4"
                else s
                for s in ctx.services
            ]
        }
    )
    assert paper_lm(other, "LM4") is None
    # A fact about an LM the scenario does not have is not applicable, not 0.
    assert fact("milp.lm4_success").measure(other, runs(milp=[Request("lm4", True, 1.0)])) is None


def test_pre_benchmark_median_and_share_within_30_s_count_successes_only(
    ctx: ClusterContext,
) -> None:
    pre = [Request("lm1", True, t) for t in (5.0, 9.0, 20.0, 40.0)] + [Request("lm4", False, 900.0)]
    r = runs(pre=pre)
    assert fact("pre.median_latency").measure(ctx, r) == pytest.approx(14.5)
    assert fact("pre.within_30s").measure(ctx, r) == pytest.approx(0.75)
    assert fact("pre.successes").measure(ctx, r) == 4


def test_per_lm_and_lm_mean_facts(ctx: ClusterContext) -> None:
    milp = [
        Request("lm1", True, 6.0),
        Request("lm1", True, 10.0),
        Request("lm4", True, 500.0),
        Request("lm4", False, 900.0),
        Request("lm4", False, 900.0),
        Request("lm4", False, 900.0),
    ]
    r = runs(milp=milp, rr=milp)
    assert fact("milp.lm1_latency").measure(ctx, r) == pytest.approx(8.0)
    assert fact("milp.lm4_success").measure(ctx, r) == pytest.approx(0.25)
    assert fact("milp.lm2_success").measure(ctx, r) is None  # no lm2 request
    assert fact("milp.lm_mean_latency").measure(ctx, r) == pytest.approx((8.0 + 500.0) / 2)
    assert fact("rr.within_tau").measure(ctx, r) == pytest.approx(3 / 6)


def test_static_facts_read_the_profiles(ctx: ClusterContext) -> None:
    gpu = {s.name: s.spec.profile.gpu_seconds_per_prompt for s in ctx.services}
    r = runs()
    assert fact("static.lm2_over_lm1_gpu").measure(ctx, r) == pytest.approx(gpu["lm2"] / gpu["lm1"])
    assert fact("static.lm1_gpu_share_of_milp").measure(ctx, r) == pytest.approx(
        gpu["lm1"] / (8.0 / 4.5)
    )
    assert fact("static.lm4_gpu_seconds").measure(ctx, r) == gpu["lm4"]


def test_rows_give_the_distance_and_whether_a_bound_holds() -> None:
    near = Row(fact("pre.median_latency"), 12.2)
    assert near.delta == pytest.approx(12.2 - 9.76)
    assert near.relative == pytest.approx((12.2 - 9.76) / 9.76)
    assert near.holds is None  # a value to be near, not a bound
    at_least = fact("static.lm2_over_lm1_gpu")
    assert Row(at_least, 2.0).holds is True
    assert Row(at_least, 0.8).holds is False
    at_most = fact("static.lm1_gpu_share_of_milp")
    assert Row(at_most, 0.3).holds is True
    assert Row(at_most, 1.3).holds is False
    missing = Row(at_most, None)
    assert missing.delta is None and missing.relative is None and missing.holds is None
    assert missing.as_dict()["lmedge"] is None
