"""The fast model construction (`api.base.built`) makes the same objects pydantic would."""

from __future__ import annotations

from collections.abc import Callable

from lmedge.api import Arrival, InstanceState, NodeState, RequestRecord, Route, Snapshot
from lmedge.api.base import built
from lmedge.backends.emulated import EmulatedBackend
from lmedge.sim import Scenario
from tests.sim.conftest import place, run_all


def test_records_and_arrivals_equal_validated_models(
    make_scenario: Callable[..., Scenario],
) -> None:
    rows = [(0, "w1", "a", 2, 0.0), (0, "w3", "b", 1, 1.0), (1, "w2", "g", 1, 0.0)]
    be = EmulatedBackend(make_scenario(rows), seed=0)
    arrivals = be.arrivals(0)
    place(be, "w1", ("a", "gpu", 4, 1))
    records = run_all(be, 1000.0)
    assert {r.outcome for r in records} == {"success", "timeout"}
    for r in records:
        again = RequestRecord.model_validate(r.model_dump())
        assert again == r and list(again.model_dump()) == list(r.model_dump())
        assert r.model_fields_set == set(RequestRecord.model_fields)
        assert r.latency_s == again.latency_s
        r.run = "run-1"  # the loop stamps the run id on drained records
        assert r.run == "run-1"
    assert arrivals == [
        Arrival(origin=r[1], lm=r[2], requests=1, prompts=r[3], request=f"0-0-{r[1]}-{r[2]}")
        for r in rows[:2]
    ]


def test_built_names_every_field_given() -> None:
    fields = {"origin": "w1", "lm": "a", "requests": 1, "prompts": 3}
    a = built(Arrival, {**fields, "request": "r1", "input_tokens": None})
    want_a = Arrival(**fields, request="r1")  # type: ignore[arg-type]
    assert a == want_a
    assert a.model_dump_json() == want_a.model_dump_json()
    # the rule router's routes: every field named, `model` as its default
    r = built(Route, {"origin": "w1", "lm": "a", "destination": "w2", "model": None})
    want = Route(origin="w1", lm="a", destination="w2")
    assert r == want and r.model_dump_json() == want.model_dump_json()
    assert r.serving_lm == "a"


def test_snapshots_equal_validated_models(make_scenario: Callable[..., Scenario]) -> None:
    rows = [(0, "w1", "a", 3, 0.0), (0, "w2", "b", 1, 0.5)]
    be = EmulatedBackend(make_scenario(rows), seed=0)
    place(be, "w1", ("a", "gpu", 4, 1))
    be.arrivals(0)
    be.emulator.run_until(0.75)
    snap = be.snapshot(0)
    assert any(n.instances for n in snap.nodes) and any(sum(n.backlog.values()) for n in snap.nodes)
    again = Snapshot.model_validate(snap.model_dump())
    assert again == snap and again.model_dump_json() == snap.model_dump_json()
    for node in snap.nodes:
        assert node.model_fields_set == set(NodeState.model_fields)
        for inst in node.instances:
            assert inst.model_fields_set == set(InstanceState.model_fields)
