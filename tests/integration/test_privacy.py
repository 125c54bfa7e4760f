"""Privacy boundary: the agents see system telemetry only, never a user's prompt text.

A run of `ma` on the LLM path in the emulator, where every request carries
user content holding a unique canary (kept beside the request as the data
plane keeps it on a real node). The canary must appear in no request body
the LLM server received, while the agents did receive their telemetry.
The observation models themselves refuse a content field.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from pydantic import ValidationError

from lmedge.api import Arrival, NodeState, RequestRecord
from lmedge.backends.emulated.backend import EmulatedBackend
from lmedge.controller.assembly import PolicyChoice, build_plugins
from lmedge.controller.loop import ControlLoop
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
