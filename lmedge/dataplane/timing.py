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
for a timed-out set to exactly tau (the contract of `RequestRecord`). This
module is pure: no clock, no I/O.
"""

from __future__ import annotations

from lmedge.api.records import RequestOutcome, RequestRecord
from lmedge.dataplane.wire import ForwardResult, StageTimes


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
    return RequestRecord(
        id=request_id,
        run=run,
        lm=lm,
        model=model,
        origin=origin,
        destination=result.destination,
        prompts=prompts,
        prompts_done=min(len(result.outputs), prompts),
        slot=slot,
        submit_s=max(submit_s, 0.0),
        uplink_s=times.uplink_s,
        queue_s=times.queue_s,
        inference_s=times.inference_s,
        downlink_s=times.downlink_s,
        outcome=result.outcome,
        conflict=result.conflict,
        mode=result.mode,
        error=error if error is not None else result.error,
    )
