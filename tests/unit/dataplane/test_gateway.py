"""The gateway core with in-process peers and fake model pods (no HTTP)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

import pytest

from lmedge.api.decisions import Route, RoutingMap
from lmedge.api.inference import InferRequest, InferResult, Output, Prompt
from lmedge.dataplane.clients import PeerUnavailable
from lmedge.dataplane.gateway import Gateway, GatewaySettings, UnknownLM
from lmedge.dataplane.queues import ModelUnavailable
from lmedge.dataplane.records import MemorySink
from lmedge.dataplane.wire import (
    ForwardRequest,
    ForwardResult,
    LocalModels,
    ModelEndpoint,
    RoutingUpdate,
)

SERVICES = {"lm1": "text-to-text", "lm4": "text-to-image"}
T = TypeVar("T")


@dataclass
class FakeModels:
    """A model pod per URL: `seconds` per prompt, optional failures before success."""

    seconds: float = 0.0
    unavailable: int = 0
    calls: list[tuple[str, str]] = field(default_factory=list)

    async def infer(self, url: str, request: InferRequest, timeout_s: float) -> InferResult:
        self.calls.append((url, request.id))
        if self.unavailable > 0:
            self.unavailable -= 1
            raise ModelUnavailable("pod restarting")
        budget = request.budget_s or float("inf")
        outputs: list[Output] = []
        spent = 0.0
        for p in request.prompts:
            if spent >= budget:
                break
            await asyncio.sleep(self.seconds)
            spent += self.seconds
            outputs.append(Output(text=f"{url}:{p.text}"))
        return InferResult(
            id=request.id,
            lm=request.lm,
            outputs=outputs,
            complete=len(outputs) == len(request.prompts),
            inference_s=spent,
            mode="gpu",
        )


@dataclass
class Peers:
    """Peer gateways reached in-process by node URL; unknown URLs are unreachable."""

    gateways: dict[str, Gateway] = field(default_factory=dict)

    async def forward(
        self, base_url: str, request: ForwardRequest, timeout_s: float
    ) -> ForwardResult:
        gw = self.gateways.get(base_url)
        if gw is None:
            raise PeerUnavailable(f"gateway at {base_url} did not answer")
        return await asyncio.wait_for(gw.accept(request), timeout_s)


def _gateway(
    node: str,
    peers: Peers,
    models: FakeModels,
    sink: MemorySink,
    *,
    tau: float = 5.0,
    model_urls: dict[str, str] | None = None,
) -> Gateway:
    settings = GatewaySettings(
        node=node,
        services=SERVICES,  # type: ignore[arg-type]
        peers={"worker-1": "w1", "worker-2": "w2", "worker-9": "w9"},
        model_urls=model_urls if model_urls is not None else {"lm1": f"http://{node}/lm1"},
        tau_s=tau,
        grace_s=0.5,
    )
    gw = Gateway(settings, peers=peers, models=models, sink=sink)
    peers.gateways[settings.peers[node]] = gw
    return gw


def _route(slot: int, *routes: tuple[str, str, str]) -> RoutingUpdate:
    return RoutingUpdate(
        run="run-1",
        slot=slot,
        run_started_at=None,
        routing=RoutingMap(routes=[Route(origin=o, lm=lm, destination=d) for o, lm, d in routes]),
    )


def run(make: Callable[[], Awaitable[T]]) -> T:
    return asyncio.run(make())


def test_unmapped_request_is_served_locally_with_record() -> None:
    async def scenario() -> None:
        sink, models, peers = MemorySink(), FakeModels(seconds=0.01), Peers()
        gw = _gateway("worker-1", peers, models, sink)
        result = await gw.submit("lm1", [Prompt(text="a"), Prompt(text="b")], "req-1")
        await gw.close()
        assert result.outcome == "success" and result.destination == "worker-1"
        assert [o.text for o in result.outputs] == [
            "http://worker-1/lm1:a",
            "http://worker-1/lm1:b",
        ]
        [record] = sink.records
        assert record.id == "req-1" and record.origin == record.destination == "worker-1"
        assert record.prompts == record.prompts_done == 2
        assert record.inference_s == pytest.approx(0.02, abs=0.01)
        assert not record.conflict

    run(scenario)


def test_request_follows_routing_map_to_other_node() -> None:
    async def scenario() -> None:
        sink, models, peers = MemorySink(), FakeModels(seconds=0.01), Peers()
        origin = _gateway("worker-1", peers, models, sink, model_urls={})
        dest = _gateway("worker-2", peers, models, MemorySink())
        origin.set_routing(_route(4, ("worker-1", "lm1", "worker-2")))
        result = await origin.submit("lm1", [Prompt(text="x")])
        await origin.close()
        await dest.close()
        assert result.destination == "worker-2" and result.outcome == "success"
        assert models.calls == [("http://worker-2/lm1", result.id)]
        [record] = sink.records
        assert (record.run, record.slot, record.destination) == ("run-1", 4, "worker-2")
        assert record.latency_s >= record.inference_s > 0

    run(scenario)


def test_inactive_lm_is_a_conflict_and_waits_for_activation() -> None:
    async def scenario() -> None:
        sink, models, peers = MemorySink(), FakeModels(), Peers()
        gw = _gateway("worker-1", peers, models, sink, model_urls={})
        gw.set_routing(_route(0))  # a map, with no route for lm1: served here
        task = asyncio.create_task(gw.submit("lm1", [Prompt(text="x")]))
        await asyncio.sleep(0.2)  # the cold start
        assert gw.status().queue_depth == {"lm1": 0}  # taken by the worker, waiting for a pod
        gw.set_models(LocalModels(models=[ModelEndpoint(lm="lm1", url="http://pod")]))
        result = await task
        await gw.close()
        assert result.outcome == "success" and result.conflict
        [record] = sink.records
        assert record.conflict and record.queue_s >= 0.2

    run(scenario)


def test_a_set_sent_before_the_first_map_follows_it_to_another_node() -> None:
    # A fresh gateway (new node, restarted pod) has no map yet: a set it cannot
    # serve itself waits for the first one instead of for a pod that never comes.
    async def scenario() -> None:
        sink, models, peers = MemorySink(), FakeModels(), Peers()
        origin = _gateway("worker-1", peers, models, sink, tau=30.0, model_urls={})
        dest = _gateway("worker-2", peers, models, MemorySink())
        task = asyncio.create_task(origin.submit("lm1", [Prompt(text="x")], "early"))
        await asyncio.sleep(0.2)
        assert not task.done()
        assert origin.status().queue_depth == {"lm1": 1}  # held: the deployer sees it
        origin.set_routing(_route(1, ("worker-1", "lm1", "worker-2")))
        result = await asyncio.wait_for(task, 10)
        await origin.close()
        await dest.close()
        assert (result.outcome, result.destination) == ("success", "worker-2")
        [record] = sink.records
        assert record.slot == 1 and record.conflict and record.queue_s >= 0.2
        assert origin.status().queue_depth == {}

    run(scenario)


def test_a_set_held_for_the_first_map_is_served_here_once_a_local_pod_registers() -> None:
    async def scenario() -> None:
        sink, models, peers = MemorySink(), FakeModels(), Peers()
        gw = _gateway("worker-1", peers, models, sink, tau=30.0, model_urls={})
        task = asyncio.create_task(gw.submit("lm1", [Prompt(text="x")], "held"))
        await asyncio.sleep(0.2)
        assert not task.done() and gw.status().queue_depth == {"lm1": 1}
        gw.set_models(LocalModels(models=[ModelEndpoint(lm="lm1", url="http://pod")]))
        result = await asyncio.wait_for(task, 10)
        await gw.close()
        assert (result.outcome, result.destination) == ("success", "worker-1")
        [record] = sink.records
        assert record.conflict and record.queue_s >= 0.2

    run(scenario)


def test_a_set_held_for_the_first_map_ends_when_the_gateway_stops() -> None:
    async def scenario() -> None:
        sink, peers = MemorySink(), Peers()
        gw = _gateway("worker-1", peers, FakeModels(), sink, tau=30.0, model_urls={})
        task = asyncio.create_task(gw.submit("lm1", [Prompt(text="x")], "held"))
        await asyncio.sleep(0.1)
        assert gw.stop_waiting() == 1
        result = await asyncio.wait_for(task, 10)
        await gw.close()
        assert result.outcome == "timeout" and result.error == "gateway shutting down"
        assert [(r.id, r.outcome) for r in sink.records] == [("held", "timeout")]

    run(scenario)


def test_never_activated_lm_times_out_at_tau() -> None:
    async def scenario() -> None:
        sink, peers = MemorySink(), Peers()
        gw = _gateway("worker-1", peers, FakeModels(), sink, model_urls={}, tau=0.3)
        result = await gw.submit("lm1", [Prompt(text="x")])
        await gw.close()
        assert result.outcome == "timeout" and result.conflict and result.error is None
        [record] = sink.records
        assert record.latency_s == pytest.approx(0.3)  # a timed-out record reports tau
        assert record.prompts_done == 0 and record.mode == "none"

    run(scenario)


def test_slow_model_returns_partial_outputs_as_timeout() -> None:
    async def scenario() -> None:
        sink, peers = MemorySink(), Peers()
        gw = _gateway("worker-1", peers, FakeModels(seconds=0.1), sink, tau=0.25)
        result = await gw.submit("lm1", [Prompt(text=str(i)) for i in range(5)])
        await gw.close()
        assert result.outcome == "timeout"
        assert 1 <= result.prompts_done < 5
        assert sink.records[0].prompts_done == result.prompts_done

    run(scenario)


def test_pod_restart_is_retried_with_same_set_id() -> None:
    async def scenario() -> None:
        sink, peers, models = MemorySink(), Peers(), FakeModels(unavailable=2)
        gw = _gateway("worker-1", peers, models, sink)
        gw.queues.retry_interval_s = 0.01
        result = await gw.submit("lm1", [Prompt(text="x")], "same-id")
        await gw.close()
        assert result.outcome == "success"
        assert [rid for _, rid in models.calls] == ["same-id"] * 3

    run(scenario)


def test_unreachable_destination_is_recorded_with_error() -> None:
    async def scenario() -> None:
        sink, peers = MemorySink(), Peers()
        gw = _gateway("worker-1", peers, FakeModels(), sink)
        gw.set_routing(_route(1, ("worker-1", "lm1", "worker-9"), ("worker-1", "lm4", "nowhere")))
        first = await gw.submit("lm1", [Prompt(text="x")])
        second = await gw.submit("lm4", [Prompt(text="x")])
        await gw.close()
        assert first.outcome == "timeout" and "did not answer" in (first.error or "")
        assert "no address for node 'nowhere'" in (second.error or "")
        assert [r.error is not None for r in sink.records] == [True, True]
        assert sink.records[0].latency_s < 1.0  # a failure keeps its real duration, not tau

    run(scenario)


def test_fifo_per_lm() -> None:
    async def scenario() -> None:
        sink, peers, models = MemorySink(), Peers(), FakeModels(seconds=0.01)
        gw = _gateway("worker-1", peers, models, sink)
        await asyncio.gather(*(gw.submit("lm1", [Prompt(text="x")], f"r{i}") for i in range(6)))
        await gw.close()
        assert [rid for _, rid in models.calls] == [f"r{i}" for i in range(6)]

    run(scenario)


def test_unknown_lm_is_refused_everywhere() -> None:
    async def scenario() -> None:
        gw = _gateway("worker-1", Peers(), FakeModels(), MemorySink())
        with pytest.raises(UnknownLM, match="unknown LM 'lm7'; this cluster serves: lm1, lm4"):
            await gw.submit("lm7", [Prompt(text="x")])
        with pytest.raises(UnknownLM, match="lm7"):
            gw.set_routing(_route(1, ("worker-1", "lm7", "worker-2")))
        with pytest.raises(UnknownLM, match="lm7"):
            gw.set_models(LocalModels(models=[ModelEndpoint(lm="lm7", url="http://x")]))
        await gw.close()

    run(scenario)


def test_metrics_count_outcomes_conflicts_and_depth() -> None:
    async def scenario() -> bytes:
        sink, peers = MemorySink(), Peers()
        gw = _gateway("worker-1", peers, FakeModels(), sink, model_urls={}, tau=0.1)
        await gw.submit("lm1", [Prompt(text="x")])
        await gw.close()
        return gw.metrics.render()

    text = run(scenario).decode()
    assert 'lmedge_gateway_requests_total{lm="lm1",outcome="timeout"} 1.0' in text
    assert 'lmedge_gateway_conflicts_total{lm="lm1"} 1.0' in text
    assert 'lmedge_gateway_success_ratio{lm="lm1"} 0.0' in text
    assert 'lmedge_gateway_stage_seconds_count{lm="lm1",stage="queue"} 1.0' in text
    assert "lmedge_gateway_queue_depth" in text
    assert "lmedge_gateway_routing_decision_seconds_count 1.0" in text
