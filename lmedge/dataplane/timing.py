"""Stage timings of a prompt set and the `RequestRecord` built from them.

Who measures what (paper Fig. 4, T2.3-T2.12):

* the origin measures the round trip `rtt` on its monotonic clock, from sending
  the set to holding the result;
* the destination measures, on its monotonic clock, the time from arrival to
  having the outputs (`queue + inference`), and the model server reports the
  compute time (`inference`); queue is the rest, so it includes waiting behind
  other sets, waiting for the LM to be activated (cold start) and model load;
* uplink is the destination's arrival wall time minus the origin's send wall
  time; this is the only cross-machine difference, so it relies on synchronised
  clocks (NTP) and is clamped into what the round trip leaves;
* downlink is what remains of the round trip.

The four stages therefore always add up to the latency the origin observed, and
for a timed-out set to exactly tau (the contract of `RequestRecord`).

A stream (`stream_record`) is split the same way, and its inference is split
further into prefill (the destination's time from taking the pod to the first
piece) and decode (the rest), scaled together when the total cuts inference.
TTFT is the origin's time from submit to the first piece arriving, TPOT the
origin's time from the first to the last piece over the tokens after the
first. Tokens are the engine's usage, or the pieces counted when the engine
reports none. A stream that ended without the destination's last event (its
client left, the peer broke off) has prefill and decode estimated at the
origin: to the first piece, and after it. This module is pure: no clock, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from lmedge.api.records import RequestOutcome, RequestRecord
from lmedge.dataplane.wire import ForwardResult, StageTimes, StreamEnd


def split_stages(
    *,
    total_s: float,
    sent_at: float,
    received_at: float,
    queue_s: float,
    inference_s: float,
) -> StageTimes:
    """Four non-negative stage times summing to `total_s`.

    `total_s` is the observed round trip, or tau for a set that missed its
    deadline (see `record_total`).

    When the parts measured elsewhere exceed the total (clock skew, or a
    timeout recorded after the deadline), the excess is taken off downlink,
    then uplink, then queue, then inference: compute time is the most
    trustworthy measurement, the cross-clock uplink the least.
    """
    total = max(total_s, 0.0)
    inference = max(inference_s, 0.0)
    queue = max(queue_s, 0.0)
    uplink = max(received_at - sent_at, 0.0)
    downlink = max(total - uplink - queue - inference, 0.0)
    excess = uplink + queue + inference + downlink - total
    parts = {"downlink": downlink, "uplink": uplink, "queue": queue, "inference": inference}
    for name in ("downlink", "uplink", "queue", "inference"):
        if excess <= 0:
            break
        cut = min(parts[name], excess)
        parts[name] -= cut
        excess -= cut
    return StageTimes(
        uplink_s=parts["uplink"],
        queue_s=parts["queue"],
        inference_s=parts["inference"],
        downlink_s=parts["downlink"],
    )


def record_total(
    *, rtt_s: float, outcome: RequestOutcome, error: str | None, tau_s: float
) -> float:
    """The latency a record reports: tau for a missed deadline, else the round trip.

    A set that failed for another reason (`error`, e.g. an unreachable
    destination) keeps the time it actually took.
    """
    if outcome == "timeout" and error is None:
        return tau_s
    return max(rtt_s, 0.0)


def build_record(
    *,
    request_id: str,
    run: str,
    lm: str,
    origin: str,
    prompts: int,
    slot: int,
    submit_s: float,
    times: StageTimes,
    result: ForwardResult,
    error: str | None = None,
    model: str | None = None,
) -> RequestRecord:
    """The record of one prompt set as the origin stores it.

    `lm` is what the user named (an LM or a request class); `model` the LM
    that served a request class (None: `lm` itself).
    """
    return _record(
        (request_id, run, lm, model, origin, slot, submit_s),
        times,
        result,
        prompts=prompts,
        done=min(len(result.outputs), prompts),
        error=error if error is not None else result.error,
    )


@dataclass(frozen=True)
class StreamClock:
    """What the origin saw of one stream, on its monotonic clock (seconds since submit).

    `first` / `last`: when the first and last pieces arrived (None: none did);
    `ended`: when it ended; `pieces`: text pieces received.
    """

    ended: float
    first: float | None = None
    last: float | None = None
    pieces: int = 0


def stream_record(
    *,
    request_id: str,
    run: str,
    lm: str,
    origin: str,
    slot: int,
    submit_s: float,
    sent_at: float,
    tau_s: float,
    clock: StreamClock,
    end: StreamEnd,
    estimated: bool,
    model: str | None = None,
) -> RequestRecord:
    """The record of one streamed prompt as the origin stores it.

    `end` is the destination's last event, or one the origin made up (`estimated`)
    when none came; then prefill and decode are the origin's estimates.
    """
    total = record_total(rtt_s=clock.ended, outcome=end.outcome, error=end.error, tau_s=tau_s)
    uplink = max(end.received_at - sent_at, 0.0)
    prefill, decode = end.prefill_s, end.decode_s
    if estimated:
        before = max(uplink + end.queue_s, 0.0)
        prefill = max((clock.first if clock.first is not None else clock.ended) - before, 0.0)
        decode = clock.ended - clock.first if clock.first is not None else 0.0
    times = split_stages(
        total_s=total,
        sent_at=sent_at,
        received_at=end.received_at,
        queue_s=end.queue_s,
        inference_s=prefill + decode,
    )
    share = prefill / (prefill + decode) if prefill + decode > 0 else 1.0
    tokens = end.completion_tokens if end.completion_tokens is not None else clock.pieces
    tpot = None
    if clock.first is not None and clock.last is not None and tokens > 1:
        tpot = (clock.last - clock.first) / (tokens - 1)
    return _record(
        (request_id, run, lm, model, origin, slot, submit_s),
        times,
        end,
        prompts=1,
        done=1 if end.outcome == "success" else 0,
        error=end.error,
        ttft_s=clock.first,
        tpot_s=tpot,
        input_tokens=end.prompt_tokens,
        output_tokens=tokens,
        prefill_s=times.inference_s * share,
        decode_s=times.inference_s * (1 - share),
    )


def _record(
    who: tuple[str, str, str, str | None, str, int, float],
    times: StageTimes,
    ended: ForwardResult | StreamEnd,
    *,
    prompts: int,
    done: int,
    error: str | None,
    **streamed: float | int | None,
) -> RequestRecord:
    """One origin record: `who` is (id, run, lm, model, origin, slot, submit_s)."""
    request_id, run, lm, model, origin, slot, submit_s = who
    return RequestRecord(
        id=request_id,
        run=run,
        lm=lm,
        model=model,
        origin=origin,
        destination=ended.destination,
        prompts=prompts,
        prompts_done=done,
        slot=slot,
        submit_s=max(submit_s, 0.0),
        uplink_s=times.uplink_s,
        queue_s=times.queue_s,
        inference_s=times.inference_s,
        downlink_s=times.downlink_s,
        outcome=ended.outcome,
        conflict=ended.conflict,
        mode=ended.mode,
        error=error,
        **streamed,
    )
