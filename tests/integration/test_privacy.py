"""Privacy boundary: the agents see system telemetry only, never a user's prompt text.

Two paths carry a unique canary in every user prompt: a run of `ma` on the
LLM path in the emulator (the content kept beside each request, as a node
holds it), and prompt sets served by the real data-plane gateway core whose
records and queue depths then feed all three agents. The canary must appear
in no request body the LLM server received, while the agents did receive
their telemetry. The observation models themselves refuse a content field.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path

import pytest
from pydantic import ValidationError

from lmedge.agents import AgenticDeployer, AgenticPlanner, AgenticRouter
from lmedge.api import (
    Arrival,
    NodeObservation,
    NodeState,
    PlanningObservation,
    RequestRecord,
    SlotObservation,
    Snapshot,
)
from lmedge.api.inference import InferRequest, InferResult, Output, Prompt
from lmedge.backends.emulated.backend import EmulatedBackend
from lmedge.controller.assembly import PolicyChoice, build_plugins
from lmedge.controller.loop import ControlLoop
from lmedge.dataplane.gateway import Gateway, GatewaySettings
from lmedge.dataplane.records import MemorySink
from lmedge.dataplane.wire import ForwardRequest, ForwardResult, GatewayStatus, RoutingUpdate
from lmedge.metrics import window_metrics
from lmedge.sim.scenario import load_scenario
from tests.fixtures.llm_server import LLMServer

TESTBED = Path(__file__).resolve().parents[2] / "examples" / "testbed"


class ContentBackend(EmulatedBackend):
    """The emulator plus the user content of every request, as a data plane holds it."""

    def __init__(self, canary: str) -> None:
        super().__init__(load_scenario(TESTBED, loop={"epoch_slots": 4}), seed=5)
        self.canary = canary
        self.content: dict[tuple[int, str, str], list[str]] = {}

    def arrivals(self, slot: int) -> list[Arrival]:
        out = super().arrivals(slot)
        for a in out:
            self.content[(slot, a.origin, a.lm)] = [
                f"user {a.origin} asks {self.canary}: summarise my medical record #{k}"
                for k in range(a.prompts)
            ]
        return out


def test_no_prompt_text_reaches_any_llm_request(llm_server: LLMServer) -> None:
    canary = f"CANARY-{uuid.uuid4().hex}"
    backend = ContentBackend(canary)
    ctx = backend.context()
    params = {"llm_base_url": llm_server.base_url, "llm_timeout_s": 2.0, "llm_budget_s": 4.0}
    choice = PolicyChoice(
        profile="ma", params={"planner": params, "router": params, "deployer": params}
    )
    loop = ControlLoop(backend, build_plugins(choice, ctx, 5), run_id="privacy", seed=5)
    result = loop.run(8)

    assert any(canary in t for texts in backend.content.values() for t in texts), "content exists"
    assert result.records, "requests were served"
    agents_heard = {d.agent for d in result.decisions if d.raw is not None}
    assert agents_heard == {"planner", "scheduler", "deployer"}
    assert len(llm_server.bodies) >= 8
    for body in llm_server.bodies:
        assert canary not in body
        assert "medical record" not in body
    telemetry = "\n".join(
        m["content"] for b in llm_server.bodies for m in json.loads(b)["messages"]
    )
    assert "queued prompts" in telemetry and "Candidates per LM" in telemetry


@pytest.mark.parametrize(
    ("model", "fields"),
    [
        (Arrival, {"origin": "worker-1", "lm": "lm1", "requests": 1, "prompts": 1}),
        (NodeState, {"name": "worker-1"}),
        (
            RequestRecord,
            {
                "id": "r1",
                "lm": "lm1",
                "origin": "worker-1",
                "destination": "worker-2",
                "prompts": 1,
                "slot": 0,
                "submit_s": 0,
                "outcome": "success",
            },
        ),
    ],
    ids=["arrival", "node-state", "request-record"],
)
def test_telemetry_models_refuse_content(model: type, fields: dict[str, object]) -> None:
    model.model_validate(fields)
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        model.model_validate({**fields, "prompt": "CANARY user text"})


class _ContentModels:
    """Model pods that answer every prompt and remember the text they saw."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    async def infer(self, url: str, request: InferRequest, timeout_s: float) -> InferResult:
        self.seen.extend(p.text for p in request.prompts)
        outputs = [Output(text=f"answer to {p.text}") for p in request.prompts]
        return InferResult(
            id=request.id, lm=request.lm, outputs=outputs, complete=True, inference_s=0.01,
            mode="gpu",
        )  # fmt: skip


class _Peers:
    def __init__(self) -> None:
        self.gateways: dict[str, Gateway] = {}

    async def forward(
        self, base_url: str, request: ForwardRequest, timeout_s: float
    ) -> ForwardResult:
        return await asyncio.wait_for(self.gateways[base_url].accept(request), timeout_s)


def test_data_plane_content_stays_out_of_agent_prompts(llm_server: LLMServer) -> None:
    """Prompt sets with the canary go through the real gateway core, routed by the LLM
    scheduler; the records and queue depths it produces feed all three agents."""
    canary = f"CANARY-{uuid.uuid4().hex}"
    ctx = load_scenario(TESTBED).context()
    params = {"llm_base_url": llm_server.base_url, "llm_timeout_s": 2.0, "llm_budget_s": 4.0}
    planner = AgenticPlanner.build(ctx, params)
    router = AgenticRouter.build(ctx, params)
    deployer = AgenticDeployer.build(ctx, params)
    macro = planner.plan(PlanningObservation(epoch=0, context=ctx)).value
    workers = [n.name for n in ctx.workers]
    arrivals = [Arrival(origin=w, lm="lm1", requests=1, prompts=2) for w in workers]
    empty = Snapshot(slot=0, time_s=0, nodes=[NodeState(name=w) for w in workers])
    routing = router.route(
        SlotObservation(
            slot=0, epoch=0, context=ctx, macro=macro, snapshot=empty, arrivals=arrivals
        )
    ).value
    models, peers, sink = _ContentModels(), _Peers(), MemorySink()
    services = {s.name: s.spec.modality for s in ctx.services}

    async def serve() -> list[GatewayStatus]:
        gateways = {}
        for w in workers:
            settings = GatewaySettings(
                node=w,
                services=services,
                peers={x: f"gw-{x}" for x in workers},
                model_urls={"lm1": f"http://{w}/lm1"},
                tau_s=30,
                grace_s=0.5,
            )
            gateways[w] = peers.gateways[f"gw-{w}"] = Gateway(
                settings, peers=peers, models=models, sink=sink
            )
        for gw in gateways.values():
            gw.set_routing(RoutingUpdate(run="privacy", slot=0, routing=routing))
        for w in workers:
            texts = [f"{canary} from {w}: my bank PIN is 4321", f"{canary} second prompt"]
            await gateways[w].submit("lm1", [Prompt(text=t) for t in texts])
        statuses = [gw.status() for gw in gateways.values()]
        for gw in gateways.values():
            await gw.close()
        return statuses

    statuses = asyncio.run(serve())
    assert sum(canary in t for t in models.seen) == 2 * len(workers), "the models saw it"
    assert len(sink.records) == len(workers)

    metrics = window_metrics(sink.records, ctx.lm_names, tau_s=30)
    states = [NodeState(name=s.node, backlog=dict(s.queue_depth)) for s in statuses]
    snap = Snapshot(slot=1, time_s=30, nodes=states)
    planner.plan(
        PlanningObservation(epoch=1, context=ctx, last=metrics, previous=macro, traffic={"lm1": 12})
    )
    router.route(
        SlotObservation(slot=1, epoch=0, context=ctx, macro=macro, snapshot=snap, arrivals=arrivals)
    )
    for s in states:
        roles = macro.role_map().get(s.name, [])
        deployer.place(
            NodeObservation(
                slot=1, epoch=0, node=ctx.node(s.name), services=ctx.services, roles=roles, state=s
            )
        )
    assert len(llm_server.bodies) == 4 + len(states), "two plans, two routings, the deployers"
    for body in llm_server.bodies:
        assert canary not in body and "PIN" not in body
