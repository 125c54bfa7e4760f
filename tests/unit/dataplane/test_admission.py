"""Admission control in the gateway core: a rejected pair is refused and recorded at once."""

from __future__ import annotations

import asyncio

import pytest

from lmedge.api.decisions import Rejection, Route, RoutingMap
from lmedge.api.inference import Prompt
from lmedge.dataplane.gateway import Gateway, GatewaySettings, Rejected, UnknownLM
from lmedge.dataplane.records import MemorySink
from lmedge.dataplane.routing import RoutingTable
from lmedge.dataplane.wire import RoutingUpdate
from lmedge.errors import TransientError
from tests.unit.dataplane.test_gateway import FakeModels, Peers

SERVICES = {"lm1": "text-to-text", "lm4": "text-to-image"}


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _update(
    slot: int, routes: list[Route], rejections: list[Rejection], **kw: float
) -> RoutingUpdate:
    return RoutingUpdate(
        run="run-1", slot=slot, routing=RoutingMap(routes=routes, rejections=rejections), **kw
    )


def _gateway(sink: MemorySink, models: FakeModels, clock: Clock) -> Gateway:
    settings = GatewaySettings(
        node="worker-1",
        services=SERVICES,  # type: ignore[arg-type]
        model_urls={"lm1": "http://worker-1/lm1", "lm4": "http://worker-1/lm4"},
        tau_s=5.0,
    )
    return Gateway(settings, peers=Peers(), models=models, sink=sink, monotonic=clock)


def test_rejected_set_is_refused_recorded_and_never_served() -> None:
    async def scenario() -> None:
        sink, models, clock = MemorySink(), FakeModels(), Clock()
        gw = _gateway(sink, models, clock)
        gw.set_routing(
            _update(
                7,
                [Route(origin="worker-1", lm="lm1", destination="worker-1")],
                [Rejection(origin="worker-1", lm="lm4"), Rejection(origin="worker-2", lm="lm1")],
                slot_s=30.0,
            )
        )
        clock.now += 12.5
        with pytest.raises(Rejected) as info:
            await gw.submit("lm4", [Prompt(text="a cat")] * 3, "req-9")
        served = await gw.submit("lm1", [Prompt(text="hi")], "req-10")
        await gw.close()
        err = info.value
        assert err.retryable and isinstance(err, TransientError)
        assert err.request_id == "req-9"
        assert err.retry_after_s == 18, "ceil(30 - 12.5): what is left of the map's slot"
        assert "admission control" in str(err) and "\n" not in str(err)
        assert [c[1] for c in models.calls] == ["req-10"], "the refused set reached no pod"
        assert served.outcome == "success", "another node's rejection does not apply here"
        refused = next(r for r in sink.records if r.id == "req-9")
        assert refused.outcome == "rejected" and refused.lm == "lm4"
        assert refused.origin == refused.destination == "worker-1"
        assert refused.prompts == 3 and refused.prompts_done == 0 and refused.slot == 7
        assert refused.latency_s == 0.0 and refused.mode == "none" and not refused.conflict
        text = gw.metrics.render().decode()
        assert 'lmedge_gateway_requests_total{lm="lm4",outcome="rejected"} 1.0' in text
        assert 'lmedge_gateway_success_ratio{lm="lm4"} 0.0' in text
        # a refusal is no latency sample: the stage histograms hold the served set only
        assert 'lmedge_gateway_stage_seconds_count{lm="lm4",stage="total"}' not in text
        assert 'lmedge_gateway_stage_seconds_count{lm="lm1",stage="total"} 1.0' in text

    asyncio.run(scenario())


def test_next_map_admits_again() -> None:
    async def scenario() -> None:
        sink, models, clock = MemorySink(), FakeModels(), Clock()
        gw = _gateway(sink, models, clock)
        gw.set_routing(_update(1, [], [Rejection(origin="worker-1", lm="lm1")]))
        with pytest.raises(Rejected):
            await gw.submit("lm1", [Prompt(text="x")])
        gw.set_routing(_update(2, [], []))
        result = await gw.submit("lm1", [Prompt(text="x")])
        await gw.close()
        assert result.outcome == "success"
        assert [r.outcome for r in sink.records] == ["rejected", "success"]

    asyncio.run(scenario())


def test_map_rejecting_an_unknown_lm_is_refused() -> None:
    async def scenario() -> None:
        gw = _gateway(MemorySink(), FakeModels(), Clock())
        with pytest.raises(UnknownLM, match="nope"):
            gw.set_routing(_update(1, [], [Rejection(origin="worker-1", lm="nope")]))
        await gw.close()

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("installed", "slot_s", "now", "expected"),
    [
        (None, 30.0, 0.0, 30),  # no push yet: a whole slot
        (10.0, 30.0, 10.0, 30),
        (10.0, 30.0, 39.2, 1),
        (10.0, 30.0, 45.0, 1),  # the controller is late: retry soon, never 0 or negative
        (10.0, 5.0, 10.5, 5),
    ],
    ids=["no-push", "fresh", "almost-over", "overdue", "short-slot"],
)
def test_retry_after_is_what_is_left_of_the_slot(
    installed: float | None, slot_s: float, now: float, expected: int
) -> None:
    table = RoutingTable(node="worker-1", slot_s=slot_s, installed_at=installed)
    assert table.retry_after_s(now) == expected


def test_a_pair_both_routed_and_rejected_is_routed() -> None:
    table = RoutingTable(node="w1")
    table.update(
        _update(
            0,
            [Route(origin="w1", lm="lm1", destination="w2")],
            [Rejection(origin="w1", lm="lm1"), Rejection(origin="w1", lm="lm4")],
        ),
        now=0.0,
    )
    assert table.destination("lm1") == "w2" and not table.rejects("lm1")
    assert table.rejects("lm4") and table.rejected() == ["lm4"]
