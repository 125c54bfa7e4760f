"""Token-engine LMs (llama.cpp, vllm) on the emulator: exact single-request times, KV
admission, token-level record fields and determinism."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from lmedge.api import PowerProfile
from lmedge.api.constants import RADIO_WATTS
from lmedge.backends.emulated import EmulatedBackend, load_scenario
from lmedge.sim import Scenario
from lmedge.sim.synthetic import edge_node, lm_service

from .conftest import place, route, run_all


def token_service(kv_cache_gib: float = 2.0, context: int = 128) -> dict[str, Any]:
    svc = lm_service("t", gpu_s=1.0, runs_on="gpu-only", vram_gib=4)
    svc["spec"]["engine"] = {
        "kind": "vllm",
        "tokens": {
            "weightsGib": 1.0,
            "kvBytesPerToken": 2**24,  # 64 tokens per GiB: a pool of a few sequences
            "kvCacheGib": kv_cache_gib,
            "contextTokens": context,
            "maxRunningSequences": 8,
            "gpus": [
                {
                    "gpuModel": "*",
                    "prefillTokensPerS": 1000,
                    "decode": [
                        {"running": 1, "tokensPerS": 100},
                        {"running": 8, "tokensPerS": 400},
                    ],
                }
            ],
        },
    }
    return svc


def with_lengths(sc: Scenario, pairs: list[tuple[int, int]]) -> Scenario:
    """`sc` with every prompt's (input, output) tokens drawn from `pairs`."""
    lines = [json.dumps({"input_tokens": i, "output_tokens": o}) for i, o in pairs]
    (sc.folder / "lengths.jsonl").write_text("\n".join(lines) + "\n")
    return load_scenario(
        sc.folder, workload={"tokenLengths": {"kind": "trace", "file": "lengths.jsonl"}}
    )


@pytest.fixture
def token_scenario(make_scenario: Callable[..., Scenario]) -> Callable[..., Scenario]:
    def make(
        rows: list[tuple[int, str, str, int, float]], pairs: list[tuple[int, int]]
    ) -> Scenario:
        nodes = [edge_node("w1", gpus=1, site="a"), edge_node("w2", gpus=1, site="a")]
        return with_lengths(make_scenario(rows, nodes=nodes, services=[token_service()]), pairs)

    return make


def test_single_request_times_follow_the_throughput_curve(
    token_scenario: Callable[..., Scenario],
) -> None:
    be = EmulatedBackend(token_scenario([(0, "w1", "t", 1, 5.0)], [(100, 11)]), seed=0)
    place(be, "w1", ("t", "gpu", 2, 1))
    route(be, 0, ("w1", "t", "w1"))
    (r,) = run_all(be, 100)
    assert r.outcome == "success"
    # prefill 100 tokens at 1000/s = 0.1 s; 10 decode iterations of 1 / 100 s = 0.1 s
    assert (r.input_tokens, r.output_tokens) == (100, 11)
    assert r.prefill_s == pytest.approx(0.1)
    assert r.decode_s == pytest.approx(0.1)
    assert r.tpot_s == pytest.approx(0.01)
    assert r.ttft_s == pytest.approx(0.1)
    assert r.inference_s == pytest.approx(0.2)
    assert r.ttft_s < r.latency_s


def test_kv_admission_holds_a_request_until_the_pool_frees(
    token_scenario: Callable[..., Scenario],
) -> None:
    # the pool holds 128 tokens: one 111-token sequence at a time
    sc = token_scenario([(0, "w1", "t", 1, 5.0), (0, "w2", "t", 1, 5.05)], [(100, 11)])
    be = EmulatedBackend(sc, seed=0)
    place(be, "w1", ("t", "gpu", 2, 1))
    route(be, 0, ("w1", "t", "w1"), ("w2", "t", "w1"))
    recs = {r.origin: r for r in run_all(be, 100)}
    first, second = recs["w1"], recs["w2"]
    assert first.outcome == second.outcome == "success"
    arrived = second.submit_s + second.uplink_s
    # admitted when the first finishes (5.2 s): waiting for KV is queue time
    assert arrived + second.queue_s == pytest.approx(5.2)
    assert second.prefill_s == pytest.approx(0.1)
    assert second.uplink_s + second.queue_s + second.inference_s + second.downlink_s == (
        pytest.approx(second.latency_s)
    )


def test_requests_batched_together_share_the_boards_energy(
    token_scenario: Callable[..., Scenario],
) -> None:
    # two 61-token sequences fit the 128-token pool: w2's joins w1's batch on arrival
    sc = token_scenario([(0, "w1", "t", 1, 5.0), (0, "w2", "t", 1, 5.0)], [(50, 11)])
    be = EmulatedBackend(sc, seed=0)
    place(be, "w1", ("t", "gpu", 2, 1))
    route(be, 0, ("w1", "t", "w1"), ("w2", "t", "w1"))
    recs = run_all(be, 100)
    assert [r.outcome for r in recs] == ["success", "success"]
    watts = PowerProfile().busy_watts_per_gpu * PowerProfile().utilization
    start = min(r.submit_s + r.uplink_s + r.queue_s for r in recs)
    end = max(r.submit_s + r.uplink_s + r.queue_s + r.inference_s for r in recs)
    processing = [r.energy_j - (r.uplink_s + r.downlink_s) * RADIO_WATTS for r in recs]
    # the board ran once from the first admission to the last token: the pair is
    # charged that once, not each request its whole inference time
    assert sum(processing) == pytest.approx((end - start) * watts)
    assert sum(processing) < sum(r.inference_s for r in recs) * watts * 0.75


def test_token_runs_are_deterministic_for_a_seed(make_scenario: Callable[..., Scenario]) -> None:
    rows = [(s, o, "t", 3, 0.5) for s in range(4) for o in ("w1", "w2")]
    nodes = [edge_node("w1", gpus=1, site="a"), edge_node("w2", gpus=1, site="a")]
    svc = token_service(kv_cache_gib=2.0, context=128)
    sc = make_scenario(rows, nodes=nodes, services=[svc], loop={"slotS": 2})

    def run(seed: int) -> list[Any]:
        be = EmulatedBackend(sc, seed=seed)
        place(be, "w1", ("t", "gpu", 2, 1))
        for s in range(4):
            route(be, s, ("w1", "t", "w1"), ("w2", "t", "w1"))
        return [r.model_dump(exclude={"id"}) for r in run_all(be, 200)]

    a, b, other = run(1), run(1), run(2)
    assert a == b
    assert all(r["outcome"] == "success" and r["output_tokens"] for r in a)
    assert [r["output_tokens"] for r in a] != [r["output_tokens"] for r in other]


def test_the_snapshot_shows_the_engines_as_a_node_agent_reads_them(
    token_scenario: Callable[..., Scenario],
) -> None:
    """Mid-run, one sequence decodes and one waits for KV: the deployer's observation and
    the stored telemetry carry the same EngineTelemetry a real engine's metrics give."""
    sc = token_scenario([(0, "w1", "t", 1, 5.0), (0, "w2", "t", 1, 5.05)], [(100, 11)])
    be = EmulatedBackend(sc, seed=0)
    place(be, "w1", ("t", "gpu", 2, 1))
    route(be, 0, ("w1", "t", "w1"), ("w2", "t", "w1"))
    be.clock.sleep_until(5.17)  # the first decodes (prefill ended at ~5.1), the second waits
    states = {n.name: n for n in be.snapshot(0).nodes}
    (engine,) = states["w1"].engines or []
    assert (engine.lm, engine.running, engine.waiting) == ("t", 1, 1)
    assert engine.kv_cache_usage is not None and 100 / 128 <= engine.kv_cache_usage <= 1
    assert states["w2"].engines is None, "a node without a token engine reports none"
    telemetry = {t.node: t for t in be.telemetry()}
    assert telemetry["w1"].engines == [engine]
    assert telemetry["w1"].kv_usage_max == engine.kv_cache_usage
