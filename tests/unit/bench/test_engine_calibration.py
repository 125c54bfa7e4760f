"""The engine calibration's pure parts: the trace, the profile fits, the error statistics."""

from __future__ import annotations

import os
import struct
import time
from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest
import typer
from typer.testing import CliRunner

from lmedge.api.engines import DecodePoint, ThroughputProfile
from lmedge.bench.engine_calibration import (
    Latency,
    Stages,
    TraceRequest,
    TraceSpec,
    bursty_arrivals,
    capacity_per_s,
    compare,
    decode_curve,
    emulate,
    error_summary,
    fit_iteration_time,
    fit_prefill_rate,
    fit_sustained,
    make_trace,
    markdown_table,
    relative_errors,
    scaled,
    stage_table,
)
from lmedge.bench.llama_server import (
    Completion,
    ServerClock,
    ServerConfig,
    gguf_metadata,
    kv_bytes_per_token,
    running_llama_server,
    server_clock,
)
from lmedge.cli.calibrate import register
from lmedge.errors import ConfigError


def test_trace_is_seeded_clipped_and_starts_at_zero() -> None:
    spec = TraceSpec(requests=150, seed=3)
    a, b = make_trace(spec, 256, 2.0), make_trace(spec, 256, 2.0)
    assert a == b
    assert len(a) == 150 and a[0].arrival_s == 0.0
    assert all(x.arrival_s <= y.arrival_s for x, y in pairwise(a))
    assert all(r.input_tokens + r.output_tokens <= 256 for r in a)
    assert make_trace(TraceSpec(requests=150, seed=4), 256, 2.0) != a
    # a faster rate compresses the same arrivals; the lengths do not change
    fast = make_trace(spec, 256, 4.0)
    assert [r.input_tokens for r in fast] == [r.input_tokens for r in a]
    assert fast[-1].arrival_s < a[-1].arrival_s


def test_bursty_arrivals_have_gaps_longer_than_the_on_rate_explains() -> None:
    rng = np.random.default_rng(0)
    t = bursty_arrivals(rng, 400, rate_on=5.0, on_s=4.0, off_s=10.0)
    gaps = np.diff(t)
    # Poisson at 5/s alone: a gap over 5 s has probability e^-25; OFF periods make many.
    assert (gaps > 5.0).sum() >= 10
    # ... and the mean rate is well under the ON rate.
    assert len(t) / t[-1] < 2.5


def test_capacity_is_the_busy_engines_request_rate() -> None:
    profile = ThroughputProfile(
        prefill_tokens_per_s=1000.0,
        decode=[
            DecodePoint(running=1, tokens_per_s=50.0),
            DecodePoint(running=4, tokens_per_s=100.0),
        ],
    )
    spec = TraceSpec(input_mean=100.0, output_mean=40.0)
    # 100 / 1000 + 40 / 100 = 0.5 s of the engine per request
    assert capacity_per_s(profile, 4, spec) == pytest.approx(2.0)


@pytest.mark.parametrize(
    ("samples", "rate"),
    [
        ([(100, 0.1), (200, 0.2), (400, 0.4)], 1000.0),
        ([(50, 0.1)], 500.0),
    ],
    ids=["proportional", "one-sample"],
)
def test_prefill_rate_recovers_a_proportional_cost(
    samples: list[tuple[int, float]], rate: float
) -> None:
    assert fit_prefill_rate(samples) == pytest.approx(rate)


def test_prefill_rate_net_of_a_fixed_step_recovers_the_rate() -> None:
    # T = 0.05 + n / 1000: the first token's decode iteration (0.05 s) and the prompt
    samples = [(n, 0.05 + n / 1000) for n in (12, 30, 120)]
    assert fit_prefill_rate(samples, 0.05) == pytest.approx(1000.0)
    with pytest.raises(ValueError, match="do not exceed the fixed cost"):
        fit_prefill_rate(samples, 1.0)


def test_prefill_rate_with_overhead_lies_between_the_sizes_rates() -> None:
    # T = 0.02 + n / 1000: small prompts look slow, large ones fast.
    samples = [(n, 0.02 + n / 1000) for n in (20, 60, 200)]
    rate = fit_prefill_rate(samples)
    assert 20 / samples[0][1] < rate < 200 / samples[2][1]


def test_prefill_rate_rejects_empty_or_zero() -> None:
    with pytest.raises(ValueError, match="positive"):
        fit_prefill_rate([(10, 0.0)])
    with pytest.raises(ValueError, match="positive"):
        fit_prefill_rate([])


@pytest.mark.parametrize(
    ("samples", "expected"),
    [
        ([(1, 0.03), (2, 0.035), (4, 0.045)], (0.025, 0.005)),
        ([(2, 0.05), (2, 0.07), (2, 0.2)], (0.07, 0.0)),  # the median repeat
        ([(1, 0.05), (4, 0.04)], (0.045, 0.0)),  # faster with more: noise, flat
        # unconstrained a = -0.01: through the origin, b = sum(k t) / sum(k^2)
        ([(1, 0.01), (2, 0.03), (4, 0.07)], (0.0, 0.35 / 21)),
    ],
    ids=["linear", "one-count", "falling-is-flat", "negative-intercept"],
)
def test_iteration_time_fit(
    samples: list[tuple[int, float]], expected: tuple[float, float]
) -> None:
    a, b = fit_iteration_time(samples)
    assert (a, b) == pytest.approx(expected)
    assert a >= 0 and b >= 0


def _burst() -> list[TraceRequest]:
    return [TraceRequest(i, 0.0, 20 + 10 * i, 5 + 3 * i) for i in range(12)]


def test_a_scaled_profile_emulates_a_burst_exactly_s_times_slower() -> None:
    profile = ThroughputProfile(prefill_tokens_per_s=1000.0, decode=decode_curve(0.025, 0.005, 4))
    base = emulate(_burst(), profile, 4 * 512, 4)
    slow = emulate(_burst(), scaled(profile, 1.5, 1.5), 4 * 512, 4)
    assert [s.e2e for s in slow] == pytest.approx([1.5 * b.e2e for b in base])
    assert [s.ttft for s in slow] == pytest.approx([1.5 * b.ttft for b in base])


@pytest.mark.parametrize(
    ("prefill", "decode"), [(1.0, 1.0), (1.3, 0.7), (0.5, 2.0), (1.1, 1.0), (1.0, 1.05)], ids=str
)
def test_sustained_fit_recovers_separate_prefill_and_decode_slow_downs(
    prefill: float, decode: float
) -> None:
    shape = ThroughputProfile(prefill_tokens_per_s=400.0, decode=decode_curve(0.025, 0.005, 4))
    truth = emulate(_burst(), scaled(shape, prefill, decode), 4 * 512, 4)
    got = fit_sustained(_burst(), truth, shape, 4 * 512, 4)
    assert got == pytest.approx((prefill, decode), rel=0.02)


@pytest.mark.parametrize(("prefill", "decode"), [(1.2, 1.0), (1.0, 1.1)], ids=str)
def test_sustained_fit_moves_off_its_start_on_a_spread_out_trace(
    prefill: float, decode: float
) -> None:
    # Arrivals spread in time make the loss flat at a tiny scale (a request's queue
    # order changes in steps); a start simplex 0.00025 wide stopped where it began.
    shape = ThroughputProfile(prefill_tokens_per_s=230.0, decode=decode_curve(0.033, 0.014, 4))
    trace = make_trace(TraceSpec(requests=60, seed=1), 1024, 0.9)
    truth = emulate(trace, scaled(shape, prefill, decode), 4096, 4)
    got = fit_sustained(trace, truth, shape, 4096, 4)
    assert got == pytest.approx((prefill, decode), rel=0.01)


def test_sustained_fit_refuses_unpaired_or_zero_latencies() -> None:
    shape = ThroughputProfile(prefill_tokens_per_s=400.0, decode=decode_curve(0.025, 0.005, 4))
    with pytest.raises(ValueError, match="one measured latency per request"):
        fit_sustained(_burst(), [], shape, 2048, 4)
    zero = [Latency(0.0, 0.1, 1.0)] * len(_burst())
    with pytest.raises(ValueError, match="positive"):
        fit_sustained(_burst(), zero, shape, 2048, 4)
    with pytest.raises(ValueError, match="positive"):
        scaled(shape, 0.0, 1.0)


def test_decode_curve_is_a_valid_profile() -> None:
    pts = decode_curve(0.025, 0.005, 4)
    assert [p.running for p in pts] == [1, 2, 3, 4]
    assert pts[0].tokens_per_s == pytest.approx(1 / 0.03)
    assert pts[3].tokens_per_s == pytest.approx(4 / 0.045)
    ThroughputProfile(prefill_tokens_per_s=1000.0, decode=pts)  # validates the monotonicity


@pytest.mark.parametrize("a", [0.03, 0.1 / 3, 0.07, 1 / 7], ids=str)
def test_decode_curve_with_a_flat_per_sequence_rate_is_valid(a: float) -> None:
    pts = decode_curve(a, 0.0, 8)
    ThroughputProfile(prefill_tokens_per_s=1000.0, decode=pts)
    assert pts[7].tokens_per_s == pytest.approx(8 / a)


def test_relative_errors_and_summary() -> None:
    measured = [Latency(0.1, 0.02, 1.0), Latency(0.2, 0.0, 2.0), Latency(0.4, 0.04, 4.0)]
    predicted = [Latency(0.11, 0.02, 0.5), Latency(0.2, 0.0, 2.0), Latency(0.2, 0.05, 4.0)]
    err = relative_errors(measured, predicted)
    assert err["ttft"] == pytest.approx([0.1, 0.0, 0.5])
    assert err["tpot"] == pytest.approx([0.0, 0.25])  # a one-token answer has no TPOT
    assert err["e2e"] == pytest.approx([0.5, 0.0, 0.0])
    rows = {r.metric: r for r in error_summary(measured, predicted)}
    assert rows["ttft"].median == pytest.approx(0.1)
    assert rows["ttft"].p90 == pytest.approx(0.42)
    assert rows["tpot"].requests == 2
    assert rows["e2e"].measured_median_s == pytest.approx(2.0)
    assert rows["tpot"].measured_median_s == pytest.approx(0.03)  # over the same two
    # ttft: median 10% but P90 42% > 30%; tpot: 12.5% and 22.5%
    assert rows["ttft"].meets_target is False and rows["tpot"].meets_target is True
    table = markdown_table(list(rows.values()))
    assert "| TTFT | 3 |" in table and "| 10.0% | 42.0% | missed |" in table
    assert "| 12.5% | 22.5% | met |" in table


def test_relative_errors_pair_request_by_request() -> None:
    with pytest.raises(ValueError, match="pair"):
        relative_errors([Latency(1, 1, 1)], [])


def test_emulate_matches_the_engine_formulas() -> None:
    profile = ThroughputProfile(
        prefill_tokens_per_s=1000.0,
        decode=[
            DecodePoint(running=1, tokens_per_s=50.0),
            DecodePoint(running=2, tokens_per_s=80.0),
        ],
    )
    trace = [TraceRequest(0, 0.0, 100, 11), TraceRequest(1, 10.0, 50, 3)]
    a, b = emulate(trace, profile, kv_capacity_tokens=1000, max_running=2)
    # llama.cpp's mixed batches: the prompt, then the iteration that samples its first token
    assert a.ttft == pytest.approx(0.1 + 1 / 50)
    assert a.tpot == pytest.approx(1 / 50)
    assert a.e2e == pytest.approx(0.12 + 10 / 50)
    assert b.ttft == pytest.approx(0.05 + 1 / 50)  # alone again: the first has finished
    blocking = emulate(trace, profile, kv_capacity_tokens=1000, max_running=2, mixed=False)
    assert blocking[0].ttft == pytest.approx(0.1)  # vLLM's form: the prompt alone


def _gguf(path: Path, kv: dict[str, int | str]) -> Path:
    out = bytearray(b"GGUF" + struct.pack("<IQQ", 3, 0, len(kv) + 1))

    def string(s: str) -> bytes:
        return struct.pack("<Q", len(s)) + s.encode()

    # an array first, to check it is skipped
    out += string("tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, 2)
    out += string("a") + string("bc")
    for key, value in kv.items():
        out += string(key)
        out += (
            struct.pack("<I", 8) + string(value)
            if isinstance(value, str)
            else struct.pack("<II", 4, value)
        )
    path.write_bytes(bytes(out))
    return path


def test_kv_bytes_per_token_from_the_gguf_header(tmp_path: Path) -> None:
    model = _gguf(
        tmp_path / "m.gguf",
        {
            "general.architecture": "gemma3",
            "gemma3.block_count": 18,
            "gemma3.attention.head_count_kv": 1,
            "gemma3.attention.key_length": 256,
            "gemma3.attention.value_length": 256,
        },
    )
    assert kv_bytes_per_token(model) == 18 * 1 * 512 * 2
    assert gguf_metadata(model, ["gemma3.block_count"]) == {"gemma3.block_count": 18}


def test_kv_bytes_per_token_names_missing_keys(tmp_path: Path) -> None:
    model = _gguf(tmp_path / "m.gguf", {"general.architecture": "x", "x.block_count": 2})
    with pytest.raises(Exception, match=r"x\.attention\.head_count_kv"):
        kv_bytes_per_token(model)


def _completion(
    planned: float, sent: float, admitted: float, first: float, last: float, n: int
) -> Completion:
    return Completion(planned, sent, admitted, first, last, n, 10, 0.0, 0.0)


def test_compare_pairs_measured_stages_with_the_emulators() -> None:
    profile = ThroughputProfile(
        prefill_tokens_per_s=1000.0, decode=[DecodePoint(running=1, tokens_per_s=50.0)]
    )
    # one slot: the second request waits for the first (0.1 + 1 / 50 + 10 / 50 = 0.32 s)
    trace = [TraceRequest(0, 0.0, 100, 11), TraceRequest(1, 0.05, 50, 3)]
    done = [
        _completion(10.0, 10.001, 10.002, 10.1, 10.3, 11),
        _completion(10.05, 10.05, 10.3, 10.36, 10.44, 3),
    ]
    rep = compare(trace, done, profile, 1000, 1, load=1.3, rate_on=2.0)
    first, second = rep.measured_stages
    assert first.send == pytest.approx(0.001) and first.wait == pytest.approx(0.001)
    assert second.wait == pytest.approx(0.25) and second.decode == pytest.approx(0.08)
    assert rep.measured[1].ttft == pytest.approx(0.31) and rep.measured[1].tpot == pytest.approx(
        0.04
    )
    emulated = rep.emulated_stages[1]
    assert (emulated.wait, emulated.prefill, emulated.decode) == pytest.approx((0.27, 0.07, 0.04))
    assert rep.predicted[1].e2e == pytest.approx(0.38)
    # the stages of each side add up to its end-to-end latency
    for m, lat in zip(rep.measured_stages, rep.measured, strict=True):
        assert m.send + m.wait + m.prefill + m.decode == pytest.approx(lat.e2e)
    table = stage_table(trace, rep.measured_stages, rep.emulated_stages)
    assert "| 1 | 0.05 | 50 | 3 | 0.0 | 250 / 270 | 60 (0) / 70 | 80 (0) / 40 |" in table
    assert [r.metric for r in rep.rows] == ["ttft", "tpot", "e2e"]
    assert rep.to_json()["requests"][1]["emulated_stages"]["wait"] == pytest.approx(0.27)


def test_stages_default_to_no_server_timings() -> None:
    assert Stages(0.0, 0.1, 0.2, 0.3).server_prefill == 0.0


def _spin(cpu_s: float) -> None:
    end = time.thread_time() + cpu_s
    while time.thread_time() < end:
        pass


def test_server_clock_counts_wall_time_when_idle_and_cpu_time_when_busy() -> None:
    # this process's main thread stands in for the server's model thread
    clock = server_clock("cpu", os.getpid())
    w0, c0 = time.monotonic(), clock.now()
    time.sleep(0.05)
    c1, w1 = clock.now(), time.monotonic()
    assert 0.05 <= c1 - c0 <= w1 - w0  # nothing in flight: the wall clock
    clock.started()
    c2 = clock.now()
    time.sleep(0.05)  # in flight, but the thread sleeps: a server waiting for a core
    c3 = clock.now()
    assert c3 - c2 < 0.02
    _spin(0.03)  # ... and it runs: its CPU time
    c4 = clock.now()
    assert c4 - c3 >= 0.029
    clock.finished()
    time.sleep(0.02)
    assert clock.now() - c4 >= 0.02  # idle again
    assert isinstance(server_clock("wall", os.getpid()).now(), float)


def test_wall_clock_is_the_monotonic_clock() -> None:
    clock = ServerClock()
    a = time.monotonic()
    t = clock.now()
    assert a <= t <= time.monotonic()


def test_cpu_clock_needs_the_threads_schedstat() -> None:
    with pytest.raises(ConfigError, match="--clock wall"):
        server_clock("cpu", 2**22 + 12345)  # above the kernel's pid_max: no such process


def test_cpu_clock_needs_one_server_thread(tmp_path: Path) -> None:
    binary, model = tmp_path / "llama-server", tmp_path / "m.gguf"
    binary.write_text("")
    model.write_text("")
    config = ServerConfig(threads=2)
    server = running_llama_server(binary, model, config, tmp_path / "log", 1, "cpu")
    with pytest.raises(ConfigError, match="--threads must be 1, got 2"), server:
        pass


def test_server_argv_turns_off_prompt_caching_and_context_checkpoints() -> None:
    argv = ServerConfig(parallel=2, slot_context=512, threads=1).argv(
        Path("llama-server"), Path("m.gguf"), 8080
    )
    assert argv[argv.index("--ctx-checkpoints") + 1] == "0"
    assert argv[argv.index("--cache-ram") + 1] == "0"
    assert argv[argv.index("--threads") + 1] == argv[argv.index("--threads-batch") + 1] == "1"
    assert argv[argv.index("--ctx-size") + 1] == "1024"
    assert "--cont-batching" in argv


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--clock", "tsc"], "--clock must be one of wall, cpu"),
        (["--loads", "0.5,x"], "--loads must be comma-separated numbers"),
        (["--loads", "0"], "--loads must be positive"),
        (["--threads", "0"], "--threads and --parallel must be at least 1"),
    ],
    ids=["clock", "loads-text", "loads-zero", "threads"],
)
def test_calibrate_engine_names_a_bad_option(argv: list[str], message: str) -> None:
    app = typer.Typer()
    register(app)
    res = CliRunner().invoke(app, ["--engine", "llama.cpp", *argv])
    assert isinstance(res.exception, ConfigError), res.output
    assert message in str(res.exception)
