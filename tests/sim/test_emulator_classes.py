"""Request classes in the emulator: a class several LMs serve, routed to a chosen model.

Services: `a` (10 s/prompt on GPU) and `b` (6 s/prompt) both serve the class
`chat`; `g` serves only itself. Records keep `lm` = the class and `model` =
the LM whose queue, pod and profile served it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from lmedge.api import Route, RoutingMap
from lmedge.backends.emulated import EmulatedBackend, load_scenario
from lmedge.errors import ManifestError
from lmedge.sim import Scenario
from lmedge.sim.synthetic import lm_service
from lmedge.sim.workload import Workload
from tests.sim.conftest import place, run_all


def services() -> list[dict[str, Any]]:
    out = [
        lm_service("a", gpu_s=10.0, cpu_s=20.0),
        lm_service("b", gpu_s=6.0, cpu_s=20.0),
        lm_service("g", gpu_s=4.0, runs_on="gpu-only", vram_gib=4),
    ]
    for svc in out[:2]:
        svc["spec"]["serves"] = ["chat"]
    return out


def test_route_model_picks_the_queue_pod_and_profile(
    make_scenario: Callable[..., Scenario],
) -> None:
    rows = [(0, "w1", "chat", 2, 0.0), (0, "w3", "chat", 1, 0.0), (0, "w1", "g", 1, 0.0)]
    be = EmulatedBackend(make_scenario(rows, services=services()), seed=0)
    assert [(a.origin, a.lm) for a in be.arrivals(0)] == [
        ("w1", "chat"),
        ("w3", "chat"),
        ("w1", "g"),
    ]
    place(be, "w2", ("b", "gpu", 4, 1))
    place(be, "w3", ("a", "cpu", 4, 0))
    place(be, "w1", ("g", "gpu", 4, 1))
    be.publish_routing(
        0,
        RoutingMap(
            routes=[
                Route(origin="w1", lm="chat", destination="w2", model="b"),
                # g does not serve chat: ignored, so the class falls back to its first model
                Route(origin="w3", lm="chat", destination="w1", model="g"),
                Route(origin="w1", lm="g", destination="w1"),
            ]
        ),
    )
    recs = {(r.origin, r.lm): r for r in run_all(be, 1000)}
    chat = recs[("w1", "chat")]
    assert (chat.model, chat.destination, chat.outcome, chat.mode) == ("b", "w2", "success", "gpu")
    assert chat.inference_s == pytest.approx(2 * 6.0)
    local = recs[("w3", "chat")]
    assert (local.model, local.destination, local.outcome) == ("a", "w3", "success")
    assert recs[("w1", "g")].model is None
    snap = be.snapshot(1)
    assert snap.node("w2").backlog == {"a": 0, "b": 0, "g": 0}


def test_workload_classes_replace_the_lm_list(make_scenario: Callable[..., Scenario]) -> None:
    sc = make_scenario(services=services())
    folder = sc.folder
    (folder / "trace.csv").unlink()
    doc = (folder / "scenario.yaml").read_text().replace("trace: trace.csv", "classes: [chat, g]")
    (folder / "scenario.yaml").write_text(doc)
    loaded = load_scenario(folder)
    assert loaded.request_classes == ["chat", "g"]
    seen = {r.lm for t in range(20) for r in Workload(loaded, 1).slot(t)}
    assert seen == {"chat", "g"}


@pytest.mark.parametrize(
    ("workload", "field"),
    [
        ({"classes": ["nope"]}, "Scenario.workload.classes.0"),
        (
            {"classes": ["chat"], "phases": [{"name": "p", "slots": 1, "prompts": {"x": {}}}]},
            "Scenario.workload.phases.0.prompts.x",
        ),
    ],
)
def test_unknown_classes_are_manifest_errors(
    make_scenario: Callable[..., Scenario], workload: dict[str, Any], field: str
) -> None:
    sc = make_scenario(services=services())
    with pytest.raises(ManifestError, match=field.replace(".", r"\.")):
        load_scenario(sc.folder, workload={"trace": None, **workload})
