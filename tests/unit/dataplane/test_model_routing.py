"""Model routing at the gateway: a request class is served by the LM the routing map chose.

As in the emulator (`EmulatedBackend.publish_routing`): `Route.model` names
the serving LM of (origin, class); without one the class's first LM serves
it; records keep `lm` = the class and `model` = the LM that served it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lmedge.api.decisions import Route, RoutingMap
from lmedge.api.inference import Prompt
from lmedge.api.manifests import load_resources
from lmedge.dataplane.gateway import Gateway, GatewaySettings, UnknownLM, request_classes
from lmedge.dataplane.records import MemorySink
from lmedge.dataplane.wire import RoutingUpdate
from lmedge.errors import ConfigError
from tests.unit.dataplane.test_gateway import FakeModels, Peers, run

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "model-routing" / "services.yaml"
SERVICES = {"lm1": "text-to-text", "lm2": "text-to-text", "lm4": "text-to-image"}
CLASSES = {"text-generation": ["lm1", "lm2"]}
PEERS = {"worker-1": "w1", "worker-2": "w2"}


def _gateway(node: str, peers: Peers, models: FakeModels, sink: MemorySink) -> Gateway:
    settings = GatewaySettings(
        node=node,
        services=SERVICES,  # type: ignore[arg-type]
        classes=CLASSES,
        peers=PEERS,
        model_urls={lm: f"http://{node}/{lm}" for lm in ("lm1", "lm2")},
        tau_s=5.0,
        grace_s=0.5,
    )
    gw = Gateway(settings, peers=peers, models=models, sink=sink)
    peers.gateways[PEERS[node]] = gw
    return gw


def _update(*routes: Route, slot: int = 1, tau_s: float | None = None) -> RoutingUpdate:
    return RoutingUpdate(run="r", slot=slot, routing=RoutingMap(routes=list(routes)), tau_s=tau_s)


def test_a_class_goes_to_the_node_and_model_the_map_chose() -> None:
    async def scenario() -> None:
        sink, models, peers = MemorySink(), FakeModels(), Peers()
        origin = _gateway("worker-1", peers, models, sink)
        dest = _gateway("worker-2", peers, models, MemorySink())
        route = Route(origin="worker-1", lm="text-generation", destination="worker-2", model="lm2")
        origin.set_routing(_update(route))
        result = await origin.submit("text-generation", [Prompt(text="hi")])
        await origin.close()
        await dest.close()
        assert models.calls == [("http://worker-2/lm2", result.id)]
        assert (result.lm, result.model, result.destination) == (
            "text-generation",
            "lm2",
            "worker-2",
        )
        [record] = sink.records
        assert (record.lm, record.model, record.outcome) == ("text-generation", "lm2", "success")

    run(scenario)


def test_without_a_model_the_class_is_served_by_its_first_lm_and_an_lm_by_itself() -> None:
    async def scenario() -> None:
        sink, models, peers = MemorySink(), FakeModels(), Peers()
        gw = _gateway("worker-1", peers, models, sink)
        gw.set_routing(
            _update(Route(origin="worker-1", lm="text-generation", destination="worker-1"))
        )
        by_class = await gw.submit("text-generation", [Prompt(text="a")])
        by_name = await gw.submit("lm2", [Prompt(text="b")])
        await gw.close()
        assert [url for url, _ in models.calls] == ["http://worker-1/lm1", "http://worker-1/lm2"]
        assert (by_class.model, by_name.model) == ("lm1", None)
        assert {(r.lm, r.model) for r in sink.records} == {
            ("text-generation", "lm1"),
            ("lm2", None),
        }

    run(scenario)


def test_a_map_giving_a_class_a_model_that_does_not_serve_it_is_refused_whole() -> None:
    async def scenario() -> None:
        models, peers = FakeModels(), Peers()
        gw = _gateway("worker-1", peers, models, MemorySink())
        good = Route(origin="worker-1", lm="text-generation", destination="worker-1", model="lm2")
        gw.set_routing(_update(good, slot=1))
        bad = Route(origin="worker-1", lm="text-generation", destination="worker-2", model="lm4")
        with pytest.raises(UnknownLM, match="text-generation -> lm4"):
            gw.set_routing(_update(bad, slot=2))
        assert gw.routing.slot == 1 and gw.serving_model("text-generation") == "lm2"
        await gw.close()

    run(scenario)


def test_a_pushed_tau_replaces_the_gateways_own() -> None:
    async def scenario() -> None:
        sink, peers = MemorySink(), Peers()
        settings = GatewaySettings(node="worker-1", services=SERVICES, tau_s=60.0)  # type: ignore[arg-type]
        gw = Gateway(settings, peers=peers, models=FakeModels(), sink=sink)
        gw.set_routing(_update(tau_s=0.3))  # the run's tau, sent by the controller
        result = await gw.submit("lm1", [Prompt(text="x")])  # no pod: waits until tau
        await gw.close()
        assert result.outcome == "timeout"
        assert sink.records[0].latency_s == pytest.approx(0.3)

    run(scenario)


def test_unknown_names_list_the_classes_too() -> None:
    async def scenario() -> None:
        gw = _gateway("worker-1", Peers(), FakeModels(), MemorySink())
        assert gw.check_lm("text-generation") == "text-to-text"
        with pytest.raises(UnknownLM, match="text-generation"):
            gw.check_lm("gpt-9")
        await gw.close()

    run(scenario)


def test_a_class_of_mixed_modalities_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="different modalities"):
        GatewaySettings(
            node="worker-1",
            services=SERVICES,  # type: ignore[arg-type]
            classes={"anything": ["lm1", "lm4"]},
        )


def test_request_classes_come_from_the_manifests_serves() -> None:
    _, services = load_resources(EXAMPLE)  # lm1 and lm2 both serve text-generation
    assert request_classes(services) == {"text-generation": ["lm1", "lm2"]}
