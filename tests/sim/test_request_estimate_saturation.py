"""A full server's queue, as the per-request routers estimate it, drains at the engine's pace.

Past its batch slots, `RequestSlot.latency_s` charges each request queued
ahead `Server.drain_s`: out / decode(slots) + in / prefill, the engine's time
between completions when its batch is full (a vLLM V0 prefill stalls the
batch). Without the prefill term a full RTX 3080 of examples/lyreo looked
~27% faster per queued request than it is, against ~17% for a 4090, so past
capacity the family kept sending the 3080s more than they finish.

Here the engine itself (`BatchingEngine`) runs a long overloaded backlog of
nominal-length requests on each GPU of examples/lyreo, and the estimate's
cost of one more request in the queue must match its measured completion
interval.
"""

from __future__ import annotations

import pytest

from lmedge.api.engine_telemetry import EngineTelemetry
from lmedge.api.engines import (
    NOMINAL_INPUT_TOKENS,
    NOMINAL_OUTPUT_TOKENS,
    concurrent_requests,
    kv_capacity_tokens,
    throughput_profile,
)
from lmedge.policies.kit.requests import RequestSlot
from lmedge.sim.tokens.batching import BatchingEngine, TokenRequest
from tests.unit.policies.lyreo.windows import lyreo_slot

#: Requests in the backlog, and the completions measured (past the start's transient).
BACKLOG, FIRST, LAST = 1200, 400, 1000


def _completion_interval(engine: BatchingEngine) -> float:
    """Mean seconds between completions of a long backlog whose lengths average the nominal."""
    for i in range(BACKLOG):  # spread lengths (deterministic) so that batches desynchronize
        spread = (i * 37) % 81 - 40
        engine.submit(
            TokenRequest(
                i, 0.0, NOMINAL_INPUT_TOKENS + spread // 2, NOMINAL_OUTPUT_TOKENS + spread
            ),
            0.0,
        )
    done: list[float] = []
    while (t := engine.next_event_time()) is not None:
        done += [r.finish_s for r in engine.advance(t)]
    assert len(done) == BACKLOG
    return (done[LAST] - done[FIRST]) / (LAST - FIRST)


@pytest.mark.parametrize("gpu", ["3080", "3090", "4090"])
def test_a_queued_request_costs_the_engines_completion_interval(gpu: str) -> None:
    obs = lyreo_slot()
    ctx, lm = obs.context, obs.context.lm_names[0]
    node = next(n for n in ctx.feasible_nodes(lm) if gpu in n)
    spec, nspec = ctx.service(lm).spec, ctx.node(node).spec
    profile = throughput_profile(spec, nspec, "gpu")
    assert profile is not None
    slots = concurrent_requests(spec, "gpu")
    engine = BatchingEngine(profile, kv_capacity_tokens(spec, "gpu"), slots)
    measured = _completion_interval(engine)

    def estimate(waiting: int) -> float:
        telemetry = EngineTelemetry(lm=lm, kv_cache_usage=0.1, running=slots, waiting=waiting)
        nodes = [
            n.model_copy(update={"engines": [telemetry]}) if n.name == node else n
            for n in obs.snapshot.nodes
        ]
        snap = obs.snapshot.model_copy(update={"nodes": nodes})
        slot = RequestSlot(ctx, obs.model_copy(update={"snapshot": snap}), lm)
        k = [s.name for s in slot.servers].index(node)
        return slot.latency_s(k, NOMINAL_INPUT_TOKENS)

    per_queued = (estimate(300) - estimate(100)) / 200
    assert per_queued == pytest.approx(measured, rel=0.05)
