"""The gateway on a live cluster: routing pushes carry the LMServices in force
and the nodes that left, and the sets a change strands end with an explicit
outcome (`lm_removed`, `node_lost`) and a record, instead of waiting for tau."""

from __future__ import annotations

import asyncio

import pytest

from lmedge.api.decisions import Route, RoutingMap
from lmedge.api.inference import Prompt
from lmedge.dataplane.gateway import UnknownLM
from lmedge.dataplane.records import MemorySink
from lmedge.dataplane.wire import RoutingUpdate
from tests.unit.dataplane.test_gateway import SERVICES, FakeModels, Peers, _gateway, run


def push(slot: int, *routes: tuple[str, str, str], services: dict[str, str] | None = None,
         lost: list[str] | None = None) -> RoutingUpdate:  # fmt: skip
    return RoutingUpdate.model_validate(
        {
            "run": "run-1",
            "slot": slot,
            "routing": RoutingMap(
                routes=[Route(origin=o, lm=lm, destination=d) for o, lm, d in routes]
            ).model_dump(),
            "services": services,
            "lost": lost or [],
        }
    )


async def until_waiting(gw: object, n: int = 1) -> None:
    for _ in range(500):
        if getattr(gw, "_waiting", 0) >= n:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the set never started waiting")


def test_a_deleted_lm_ends_its_queued_sets_with_lm_removed() -> None:
    async def scenario() -> None:
        sink, models, peers = MemorySink(), FakeModels(), Peers()
        # lm4 has no model pod here: its set waits in the queue (a cold start)
        gw = _gateway("worker-1", peers, models, sink, tau=30.0)
        waiting = asyncio.create_task(gw.submit("lm4", [Prompt(text="a")], "q1"))
        await until_waiting(gw)

        gw.set_routing(push(1, services={"lm1": "text-to-text"}))
        result = await asyncio.wait_for(waiting, 5)

        assert result.outcome == "lm_removed"
        assert "LMService lm4 was deleted" in (result.error or "")
        assert [(r.id, r.outcome) for r in sink.records] == [("q1", "lm_removed")]
        with pytest.raises(UnknownLM):
            await gw.submit("lm4", [Prompt(text="b")])
        await gw.close()

    run(scenario)


def test_a_set_held_for_the_first_map_ends_with_lm_removed_when_that_map_drops_its_lm() -> None:
    async def scenario() -> None:
        sink, models, peers = MemorySink(), FakeModels(), Peers()
        gw = _gateway("worker-1", peers, models, sink, tau=30.0, model_urls={})
        held = asyncio.create_task(gw.submit("lm4", [Prompt(text="a")], "h1"))
        await until_waiting(gw)
        assert gw.routing.installed_at is None  # held: no map yet

        gw.set_routing(push(0, services={"lm1": "text-to-text"}))
        result = await asyncio.wait_for(held, 5)

        assert (result.outcome, result.destination) == ("lm_removed", "worker-1")
        assert [(r.id, r.outcome) for r in sink.records] == [("h1", "lm_removed")]
        await gw.close()

    run(scenario)


def test_a_lost_destination_ends_the_sets_sent_to_it_with_node_lost() -> None:
    async def scenario() -> None:
        sink, models, peers = MemorySink(), FakeModels(), Peers()
        origin = _gateway("worker-1", peers, models, sink, tau=30.0)
        # worker-2 holds the set: no lm4 pod there, so it waits
        _gateway("worker-2", peers, models, MemorySink(), tau=30.0, model_urls={})
        origin.set_routing(push(0, ("worker-1", "lm4", "worker-2")))
        sent = asyncio.create_task(origin.submit("lm4", [Prompt(text="a")], "q1"))
        await until_waiting(origin)

        origin.set_routing(push(1, lost=["worker-2"]))
        result = await asyncio.wait_for(sent, 5)

        assert (result.outcome, result.destination) == ("node_lost", "worker-2")
        assert [(r.id, r.outcome, r.destination) for r in sink.records] == [
            ("q1", "node_lost", "worker-2")
        ]
        await origin.close()

    run(scenario)


def test_a_lost_node_ends_the_sets_queued_at_itself() -> None:
    async def scenario() -> None:
        sink, models, peers = MemorySink(), FakeModels(), Peers()
        gw = _gateway("worker-1", peers, models, sink, tau=30.0, model_urls={})
        queued = asyncio.create_task(gw.submit("lm1", [Prompt(text="a")], "q1"))
        await until_waiting(gw)

        gw.set_routing(push(1, lost=["worker-1"]))  # cordoned: its pods are being drained

        assert (await asyncio.wait_for(queued, 5)).outcome == "node_lost"
        assert [r.outcome for r in sink.records] == ["node_lost"]
        await gw.close()

    run(scenario)


def test_a_pushed_new_lm_is_served_and_routed() -> None:
    async def scenario() -> None:
        sink, models, peers = MemorySink(), FakeModels(), Peers()
        gw = _gateway("worker-1", peers, models, sink)
        with pytest.raises(UnknownLM):  # not in this gateway's start-up services
            gw.set_routing(push(0, ("worker-1", "lm9", "worker-1")))

        gw.set_routing(
            push(1, ("worker-1", "lm9", "worker-1"), services={**SERVICES, "lm9": "text-to-text"})
        )

        assert gw.check_lm("lm9") == "text-to-text"
        assert gw.routing.destination("lm9") == "worker-1"
        await gw.close()

    run(scenario)
