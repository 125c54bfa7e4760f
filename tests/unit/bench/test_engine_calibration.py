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
    Measurements,
    Stages,
    TraceRequest,
    TraceSpec,
    bursty_arrivals,
    capacity_per_s,
    compare,
    decode_counts,
    decode_curve,
    emulate,
    error_summary,
    fit_iteration_times,
    fit_prefill_rate,
    level_factors,
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
    ("max_running", "expected"),
    [(1, [1]), (4, [1, 2, 3, 4]), (8, list(range(1, 9))), (20, [*range(1, 9), 16, 20])],
    ids=str,
)
def test_decode_counts_measure_every_small_count(max_running: int, expected: list[int]) -> None:
    assert decode_counts(max_running) == expected


@pytest.mark.parametrize(
    ("samples", "expected"),
    [
        # llama-server's CPU shape: t(2) ~ 2 t(1), t(4) ~ t(3); a line missed k = 1 and 3
        ([(1, 0.027), (2, 0.052), (3, 0.074), (4, 0.075)], [0.027, 0.052, 0.074, 0.075]),
        # the median repeat at each count
        ([(1, 0.03), (1, 0.5), (1, 0.031), (2, 0.05)], [0.031, 0.05, 0.05, 0.05]),
        # between measured counts: linear in k; after the last: flat
        ([(1, 0.02), (4, 0.05)], [0.02, 0.03, 0.04, 0.05]),
        # faster with more sequences (noise): never falls
        ([(1, 0.05), (2, 0.04)], [0.05, 0.05, 0.05, 0.05]),
        # t(2) > 2 t(1) would lower the aggregate rate: clipped to 2 t(1)
        ([(1, 0.018), (2, 0.045), (4, 0.062)], [0.018, 0.036, 0.0535, 0.062]),
    ],
    ids=["llama-cpu", "median", "interpolated", "falling-is-flat", "aggregate-never-falls"],
)
def test_iteration_times(samples: list[tuple[int, float]], expected: list[float]) -> None:
    times = fit_iteration_times(samples, 4)
    assert times == pytest.approx(expected)
    ThroughputProfile(prefill_tokens_per_s=1000.0, decode=decode_curve(times))  # a valid curve


def test_iteration_times_reject_bad_samples() -> None:
    with pytest.raises(ValueError, match="running >= 1"):
        fit_iteration_times([(0, 0.1)], 4)
    with pytest.raises(ValueError, match="running >= 1"):
        fit_iteration_times([], 4)
    with pytest.raises(ValueError, match="max_running"):
        fit_iteration_times([(1, 0.1)], 0)


def _burst() -> list[TraceRequest]:
    return [TraceRequest(i, 0.0, 20 + 10 * i, 5 + 3 * i) for i in range(12)]


def test_a_scaled_profile_emulates_a_burst_exactly_s_times_slower() -> None:
    profile = ThroughputProfile(
        prefill_tokens_per_s=1000.0, decode=decode_curve([0.03, 0.035, 0.04, 0.045])
    )
    base = emulate(_burst(), profile, 4 * 512, 4)
    slow = emulate(_burst(), scaled(profile, 1.5, 1.5), 4 * 512, 4)
    assert [s.e2e for s in slow] == pytest.approx([1.5 * b.e2e for b in base])
    assert [s.ttft for s in slow] == pytest.approx([1.5 * b.ttft for b in base])
    with pytest.raises(ValueError, match="positive"):
        scaled(profile, 0.0, 1.0)


def _samples(prefill: float, decode: float, times: list[float], rate: float) -> Measurements:
    """What `measure` times on a server `prefill` / `decode` times slower than one whose
    iteration takes `times` and whose prompts alone take n / rate + t(1)."""
    m = Measurements()
    for k, t in enumerate(times, start=1):
        m.decode += [(k, decode * t)] * k
    for n in (12, 40, 120):
        m.prefill.append((n, prefill * n / rate + decode * times[0]))
    return m


@pytest.mark.parametrize(
    ("prefill", "decode"), [(1.0, 1.0), (1.3, 0.8), (0.7, 1.25), (1.1, 1.0)], ids=str
)
def test_level_factors_recover_separate_prefill_and_decode_slow_downs(
    prefill: float, decode: float
) -> None:
    # t(3) > t(4) and t(2) > 2 t(1), as measured: the profile's rules cannot hold
    # them, the level compares the measurements themselves
    times = [0.018, 0.047, 0.080, 0.065]
    reference = _samples(1.0, 1.0, times, 210.0)
    got = level_factors(_samples(prefill, decode, times, 210.0), reference, times[0])
    assert got == pytest.approx((prefill, decode))


def test_level_factors_take_the_median_and_refuse_missing_samples() -> None:
    times = [0.03, 0.05]
    reference = _samples(1.0, 1.0, times, 200.0)
    m = _samples(1.2, 1.1, times, 200.0)
    m.decode.append((1, 10.0))  # one slow repeat (a neighbour's burst) does not move the level
    m.prefill.append((40, 10.0))
    m.prefill.append((12, 1.2 * 12 / 200.0 + 1.1 * 0.03))
    assert level_factors(m, reference, times[0]) == pytest.approx((1.2, 1.1))
    with pytest.raises(ValueError, match="decode and prefill samples"):
        level_factors(Measurements(), reference, times[0])
    other = Measurements(decode=[(3, 0.1)], prefill=[(7, 0.2)])  # counts the reference lacks
    with pytest.raises(ValueError, match="reference's counts and sizes"):
        level_factors(other, reference, times[0])
    with pytest.raises(ValueError, match="outlast a decode step"):
        level_factors(m, reference, 1.0)


def test_compare_emulates_at_the_re_timed_level() -> None:
    times = [0.03, 0.05]
    profile = ThroughputProfile(prefill_tokens_per_s=200.0, decode=decode_curve(times))
    trace = _burst()[:4]
    done = [
        Completion(
            planned_s=r.arrival_s,
            sent_s=r.arrival_s,
            admitted_s=r.arrival_s,
            first_s=r.arrival_s + 0.1,
            last_s=r.arrival_s + 1.0,
            tokens=r.output_tokens,
            prompt_tokens=r.input_tokens,
            server_prompt_s=0.1,
            server_decode_s=0.9,
        )
        for r in trace
    ]
    rep = compare(trace, done, profile, 2048, 2, 1.0, 1.0, (1.5, 1.5))
    base = emulate(trace, profile, 2048, 2)
    assert rep.level == (1.5, 1.5)
    assert [p.e2e for p in rep.predicted] == pytest.approx([1.5 * b.e2e for b in base])


def test_decode_curve_is_a_valid_profile() -> None:
    pts = decode_curve([0.03, 0.035, 0.04, 0.045])
    assert [p.running for p in pts] == [1, 2, 3, 4]
    assert pts[0].tokens_per_s == pytest.approx(1 / 0.03)
    assert pts[3].tokens_per_s == pytest.approx(4 / 0.045)
    ThroughputProfile(prefill_tokens_per_s=1000.0, decode=pts)  # validates the monotonicity


@pytest.mark.parametrize("a", [0.03, 0.1 / 3, 0.07, 1 / 7], ids=str)
def test_decode_curve_with_a_flat_per_sequence_rate_is_valid(a: float) -> None:
    pts = decode_curve([a] * 8)
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
