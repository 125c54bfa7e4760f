"""The continuous-batching engine core, on small cases computed by hand.

Profile: prefill 100 tokens/s, decode 10 tokens/s alone and 16 tokens/s for
two sequences (0.1 s and 0.125 s per iteration).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from lmedge.api.engines import ThroughputProfile
from lmedge.sim.tokens import BatchingEngine, TokenRequest
from lmedge.sim.tokens.lengths import LengthSampler, LognormalLengths

PROFILE = ThroughputProfile.model_validate(
    {
        "prefillTokensPerS": 100,
        "decode": [{"running": 1, "tokensPerS": 10}, {"running": 2, "tokensPerS": 16}],
    }
)


def engine(capacity: int = 10_000, max_running: int = 8) -> BatchingEngine:
    return BatchingEngine(PROFILE, capacity, max_running)


def drain(e: BatchingEngine) -> list[TokenRequest]:
    done: list[TokenRequest] = []
    while (t := e.next_event_time()) is not None:
        done += e.advance(t)
    return done


def test_one_sequence() -> None:
    e = engine()
    r = TokenRequest(1, 0.0, input_tokens=50, output_tokens=11)
    e.submit(r, 0.0)
    assert drain(e) == [r]
    # prefill 50 / 100 = 0.5 s gives the first token; 10 iterations of 0.1 s the rest
    assert (r.admitted_s, r.first_token_s, r.finish_s) == (0.0, 0.5, pytest.approx(1.5))
    assert (r.ttft_s, r.tpot_s, r.e2e_s) == (0.5, pytest.approx(0.1), pytest.approx(1.5))
    # KV held: 50 tokens during the prefill, then 51, 52, ..., 60 over the iterations
    assert e.kv_token_s == pytest.approx(50 * 0.5 + 0.1 * sum(range(51, 61)))
    assert (e.running, e.kv_reserved_tokens, e.kv_used_tokens, e.busy) == (0, 0, 0, False)


def test_a_one_token_answer_ends_with_its_prefill() -> None:
    e = engine()
    r = TokenRequest(1, 0.0, 30, 1)
    e.submit(r, 0.0)
    assert drain(e) == [r] and r.finish_s == r.first_token_s == 0.3 and r.tpot_s == 0.0


def test_two_sequences_entering_and_leaving() -> None:
    e = engine()
    a, b = TokenRequest(1, 0.0, 100, 11), TokenRequest(2, 1.25, 50, 3)
    e.submit(a, 0.0)
    assert e.advance(1.25) == []
    e.submit(b, 1.25)
    # b waits for the end of a's iteration in progress (1.3), is prefilled (0.5 s, a stalls),
    # then both decode at 0.125 s per iteration: b's 2 tokens by 2.05, a's last 5 alone by 2.55
    assert drain(e) == [b, a]
    assert (b.admitted_s, b.first_token_s, b.finish_s) == pytest.approx((1.3, 1.8, 2.05))
    assert (a.first_token_s, a.finish_s) == pytest.approx((1.0, 2.55))
    held = 100 * 1.0 + 0.1 * (101 + 102 + 103) + 154 * 0.5 + 0.125 * (155 + 157)
    assert e.kv_token_s == pytest.approx(held + 0.1 * sum(range(106, 111)))
    assert [s.t_s for s in e.timeline] == pytest.approx([0, 1.0, 1.3, 1.8, 2.05, 2.55])
    assert [(s.used_tokens, s.reserved_tokens) for s in e.timeline] == (
        [
            (100, 111),
            (101, 111),
            (154, 164),
            (155, 164),
            (106, 111),
            (0, 0),
        ]
    )


def test_a_mixed_batch_decodes_the_running_sequences_during_a_prefill() -> None:
    """As llama-server batches: every step is one forward pass that samples a token for
    each sequence in it. a alone: 100 / 100 + 1 / 10 = 1.1 s to its first token, then
    0.1 s per token (1.2, 1.3). b's prefill at 1.3 carries a's next token: 50 / 100 +
    2 / 16 = 0.625 s, b's first token at 1.925, its last two at 0.125 s per iteration
    (2.175); a has 4 tokens at 1.925, 6 at 2.175, then 5 more alone by 2.675."""
    e = BatchingEngine(PROFILE, 10_000, 8, mixed=True)
    a, b = TokenRequest(1, 0.0, 100, 11), TokenRequest(2, 1.25, 50, 3)
    e.submit(a, 0.0)
    assert e.advance(1.25) == []
    e.submit(b, 1.25)
    assert drain(e) == [b, a]
    assert (b.admitted_s, b.first_token_s, b.finish_s) == pytest.approx((1.3, 1.925, 2.175))
    assert (a.first_token_s, a.finish_s) == pytest.approx((1.1, 2.675))
    assert [(s.used_tokens, s.reserved_tokens) for s in e.timeline][:4] == [
        (100, 111),
        (101, 111),
        (153, 164),
        (155, 164),  # a's fourth token and b's first, written by the mixed batch
    ]


def test_arrivals_at_a_prefills_start_share_its_batch() -> None:
    e = engine()
    a, b = TokenRequest(1, 0.0, 100, 3), TokenRequest(2, 0.0, 100, 5)
    e.submit(a, 0.0)
    e.submit(b, 0.0)
    assert drain(e) == [a, b]
    assert a.first_token_s == b.first_token_s == 2.0  # one prefill of 200 tokens
    assert (a.finish_s, b.finish_s) == pytest.approx((2.25, 2.45))


@pytest.mark.parametrize(
    ("capacity", "max_running"), [(200, 8), (10_000, 1)], ids=["kv", "running"]
)
def test_admission_waits_for_room(capacity: int, max_running: int) -> None:
    e = engine(capacity, max_running)
    a, b = TokenRequest(1, 0.0, 100, 50), TokenRequest(2, 0.0, 50, 50)  # 150 + 100 > 200
    e.submit(a, 0.0)
    e.submit(b, 0.1)
    assert e.waiting[0] is b
    assert drain(e) == [a, b]
    assert a.finish_s == pytest.approx(1.0 + 4.9)
    assert b.admitted_s == a.finish_s
    assert b.finish_s == pytest.approx(5.9 + 0.5 + 4.9)


def test_the_queue_is_fifo_a_small_request_does_not_overtake() -> None:
    e = engine(capacity=210)  # small would fit beside big; blocked would not
    big, blocked, small = (
        TokenRequest(1, 0, 100, 50),
        TokenRequest(2, 0, 100, 90),
        TokenRequest(3, 0, 10, 5),
    )
    for r in (big, blocked, small):
        e.submit(r, 0.0)
    drain(e)
    assert small.admitted_s == blocked.admitted_s == big.finish_s


def test_a_request_larger_than_the_pool_is_refused() -> None:
    with pytest.raises(ValueError, match="needs 201 KV tokens; the pool holds 200"):
        engine(capacity=200).submit(TokenRequest(1, 0, 100, 101), 0.0)


def test_a_batch_shares_the_board_each_sequence_is_charged_its_part() -> None:
    e = engine()
    a, b = TokenRequest(1, 0.0, 100, 11), TokenRequest(2, 1.25, 50, 3)
    e.submit(a, 0.0)
    e.advance(1.25)
    e.submit(b, 1.25)
    drain(e)
    # as above: a alone 0-1.3, both 1.3-2.05 (each half of 0.75 s), a alone 2.05-2.55
    assert (a.board_s, b.board_s) == pytest.approx((1.3 + 0.375 + 0.5, 0.375))
    # the charges add up to the engine's busy time, not to the sum of the e2e times
    assert a.board_s + b.board_s == pytest.approx(2.55)


def test_a_half_share_charges_half_the_board_and_a_cancel_stops_the_charge() -> None:
    e = engine()
    e.set_share(0.5, 0.0)
    a, b = TokenRequest(1, 0.0, 50, 11), TokenRequest(2, 0.0, 50, 11)
    e.submit(a, 0.0)
    e.submit(b, 0.0)
    e.advance(0.6)
    assert e.board_s_at(a, 0.8) == pytest.approx(0.8 * 0.5 / 2)
    e.cancel(b, 0.8)
    assert b.board_s == pytest.approx(0.2)
    assert e.board_s_at(b, 5.0) == b.board_s  # no longer admitted: no more charge
    drain(e)
    assert a.board_s == pytest.approx(0.2 + 0.5 * (a.finish_s - 0.8))


def test_half_the_share_doubles_every_time() -> None:
    e = engine()
    e.set_share(0.5, 0.0)
    r = TokenRequest(1, 0.0, 50, 11)
    e.submit(r, 0.0)
    drain(e)
    assert (r.first_token_s, r.finish_s) == pytest.approx((1.0, 3.0))


def test_a_share_change_mid_decode_slows_the_rest() -> None:
    e = engine()
    r = TokenRequest(1, 0.0, 50, 11)
    e.submit(r, 0.0)
    e.advance(1.0)  # 5 of 10 iterations done
    e.set_share(0.5, 1.0)
    drain(e)
    assert r.finish_s == pytest.approx(1.0 + 5 * 0.2)


def test_time_cannot_run_backwards_and_share_is_a_fraction() -> None:
    e = engine()
    e.advance(2.0)
    with pytest.raises(ValueError, match="backwards"):
        e.submit(TokenRequest(1, 1.0, 1, 1), 1.0)
    with pytest.raises(ValueError, match=r"share must be in \(0, 1\]"):
        e.set_share(0.0, 2.0)


def _run(seed: int) -> list[tuple[float, float, float]]:
    rng = np.random.default_rng(seed)
    inp, out = LengthSampler(LognormalLengths()).draw(rng, 300, 2048)
    arrivals = np.cumsum(rng.exponential(0.5, 300))
    e = BatchingEngine(PROFILE.model_copy(update={"prefill_tokens_per_s": 4000.0}), 20_000, 16)
    reqs = [
        TokenRequest(i, float(t), int(a), int(b))
        for i, (t, a, b) in enumerate(zip(arrivals, inp, out, strict=True))
    ]
    for r in reqs:
        e.advance(r.arrival_s)
        e.submit(r, r.arrival_s)
    assert len(drain(e)) + sum(1 for r in reqs if not math.isnan(r.finish_s)) >= 300
    return [(r.admitted_s, r.first_token_s, r.finish_s) for r in reqs]


def test_deterministic_for_a_seed_and_every_request_finishes() -> None:
    first = _run(7)
    assert first == _run(7)
    assert first != _run(8)
    assert all(not math.isnan(f) and a <= t <= f for a, t, f in first)
