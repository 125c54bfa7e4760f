"""A scenario's timeline of cluster events, through `EmulatedBackend.refresh(slot)`.

Every change lands at a slot boundary; requests it strands end `node_lost` or
`lm_removed`; no request vanishes (records are counted against arrivals).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from lmedge.api import LMPlacement, Placement
from lmedge.backends.emulated import EmulatedBackend
from lmedge.bench.runner import RunSpec, run
from lmedge.controller.assembly import PolicyChoice
from lmedge.errors import ManifestError
from lmedge.sim import Scenario, load_scenario
from lmedge.sim.synthetic import lm_service
from lmedge.sim.workload import Workload
from tests.sim.conftest import place, route, run_all

ROOT = Path(__file__).resolve().parents[2]


def _by_id(records: list[Any]) -> dict[tuple[int, str, str], Any]:
    return {(r.slot, r.origin, r.lm): r for r in records}


def test_node_down_ends_its_requests_node_lost_and_it_comes_back_empty(
    make_scenario: Callable[..., Scenario],
) -> None:
    rows = [
        (1, "w1", "g", 20, 0.0),  # 20 x 4 s on w1: in service when w1 goes down at t=60
        (1, "w2", "g", 5, 1.0),  # routed to w1, queued behind it
        (2, "w1", "g", 1, 5.0),  # its origin is down: lost at once
        (2, "w2", "g", 1, 5.0),  # routed to w1 while down: served locally instead
        (4, "w1", "g", 1, 0.0),  # after w1 is back: it waits for a new pod
    ]
    be = EmulatedBackend(
        make_scenario(rows, timeline=[{"slot": 2, "nodeDown": {"node": "w1", "untilSlot": 4}}]),
        seed=0,
    )
    first = be.refresh(0)
    assert not first.changed and first.context.has_node("w1")
    place(be, "w1", ("g", "gpu", 4, 1))
    route(be, 1, ("w2", "g", "w1"))
    assert run_all(be, 60.0) == []
    update = be.refresh(2)
    assert [(c.kind, c.name) for c in update.changes] == [("node_down", "w1")]
    assert update.needs_replan and not update.context.has_node("w1")
    assert be.context() is update.context
    assert not be.refresh(2).changed  # idempotent, each change reported once
    assert "w1" not in [n.name for n in be.snapshot(2).nodes]
    assert "w1" not in [t.node for t in be.telemetry()]
    down = be.apply_placement(
        Placement(node="w1", lms=[LMPlacement(lm="g", mode="gpu", cpu_cores=4, vgpus=1)])
    )
    assert down.errors == ["w1 is down"] and not down.started
    stranded = _by_id(be.drain_records())
    assert {k: r.outcome for k, r in stranded.items()} == {
        (1, "w1", "g"): "node_lost",
        (1, "w2", "g"): "node_lost",
    }
    serving = stranded[(1, "w1", "g")]
    assert serving.destination == "w1" and 0 < serving.prompts_done < 20
    assert serving.latency_s == pytest.approx(60.0 - 30.0)  # it ended when the node did
    assert stranded[(1, "w2", "g")].prompts_done == 0
    place(be, "w2", ("g", "gpu", 4, 1))
    route(be, 2, ("w2", "g", "w1"))
    slot2 = _by_id(run_all(be, 120.0))
    assert slot2[(2, "w1", "g")].outcome == "node_lost"
    assert slot2[(2, "w1", "g")].latency_s == 0.0
    assert (slot2[(2, "w2", "g")].outcome, slot2[(2, "w2", "g")].destination) == ("success", "w2")
    back = be.refresh(4)
    assert [(c.kind, c.name) for c in back.changes] == [("node_up", "w1")]
    assert be.snapshot(4).node("w1").instances == []  # no pod survived
    place(be, "w1", ("g", "gpu", 4, 1))
    last = _by_id(run_all(be, 200.0))
    assert last[(4, "w1", "g")].outcome == "success"
    stats = be.emulator.stats
    assert stats["submitted"] == len(rows) and stats["node_lost"] == 1


def test_deleted_lm_ends_its_requests_lm_removed_and_an_applied_one_is_served(
    make_scenario: Callable[..., Scenario],
) -> None:
    rows = [
        (0, "w3", "b", 10, 0.0),  # 10 x 20 s on CPU at w3: still in service at t=30
        (0, "w3", "c", 1, 1.0),  # c does not exist yet: no LM serves it
        (1, "w3", "b", 1, 1.0),  # b is gone
        (2, "w3", "c", 1, 1.0),  # c is in force and placed
    ]
    timeline = [
        {"slot": 1, "delete": {"kind": "LMService", "name": "b"}},
        {"slot": 2, "apply": lm_service("c", gpu_s=2.0, cpu_s=3.0)},
    ]
    be = EmulatedBackend(make_scenario(rows, timeline=timeline), seed=0)
    assert be.context().lm_names == ["a", "b", "g"]
    place(be, "w3", ("b", "cpu", 4, 0))
    early = _by_id(run_all(be, 30.0))
    assert early[(0, "w3", "c")].outcome == "lm_removed"
    update = be.refresh(1)
    assert [(c.kind, c.name) for c in update.changes] == [("lm_removed", "b")]
    assert update.context.lm_names == ["a", "g"]
    snap = be.snapshot(1).node("w3")
    assert snap.instances == [] and "b" not in snap.backlog
    removed = _by_id(be.drain_records())
    assert removed[(0, "w3", "b")].outcome == "lm_removed"
    assert removed[(0, "w3", "b")].prompts_done == 1  # 20 s of 30 had passed: one prompt done
    assert be.arrivals(1) == []  # the controller never sees a request for a deleted LM
    gone = be.apply_placement(
        Placement(node="w3", lms=[LMPlacement(lm="b", mode="cpu", cpu_cores=4, vgpus=0)])
    )
    assert gone.errors == ["unknown LM 'b'"] and not gone.started
    slot1 = _by_id(run_all(be, 60.0))
    assert slot1[(1, "w3", "b")].outcome == "lm_removed"
    added = be.refresh(2)
    assert [(c.kind, c.name) for c in added.changes] == [("lm_added", "c")]
    assert added.context.lm_names == ["a", "g", "c"]
    assert [a.lm for a in be.arrivals(2)] == ["c"]
    place(be, "w3", ("c", "cpu", 4, 0))
    served = _by_id(run_all(be, 200.0))
    assert served[(2, "w3", "c")].outcome == "success"
    assert be.emulator.stats["lm_removed"] == 2  # the two refused at once


def test_edited_lm_has_its_pods_replaced_and_serves_at_the_new_speed(
    make_scenario: Callable[..., Scenario],
) -> None:
    rows = [(1, "w1", "a", 2, 5.0)]
    timeline = [{"slot": 1, "apply": lm_service("a", gpu_s=5.0, cpu_s=20.0)}]
    be = EmulatedBackend(make_scenario(rows, timeline=timeline), seed=0)
    place(be, "w1", ("a", "gpu", 4, 1))
    run_all(be, 30.0)
    assert be.snapshot(1).node("w1").instances[0].status == "ready"
    update = be.refresh(1)
    assert [(c.kind, c.name) for c in update.changes] == [("lm_edited", "a")]
    pod = be.snapshot(1).node("w1").instances[0]
    assert (pod.lm, pod.mode, pod.cpu_cores, pod.vgpus, pod.status) == ("a", "gpu", 4, 1, "pending")
    (rec,) = run_all(be, 120.0)
    assert rec.outcome == "success"
    assert rec.inference_s == pytest.approx(2 * 5.0)  # the edited profile, not 2 x 10 s


def test_link_change_applies_both_ways_and_in_the_context(
    make_scenario: Callable[..., Scenario],
) -> None:
    timeline = [{"slot": 1, "link": {"sites": ["a", "b"], "latencyMs": 100, "bandwidthMbps": 10}}]
    be = EmulatedBackend(make_scenario(timeline=timeline), seed=0)
    net = be.emulator.network
    assert net.delay("w1", "w3", 0) == pytest.approx(0.020)
    update = be.refresh(1)
    assert [(c.kind, c.name) for c in update.changes] == [("link_changed", "a->b")]
    assert not update.needs_replan
    net = be.emulator.network
    assert net.delay("w1", "w3", 100) == pytest.approx(0.1 + 100 * 8192 / 10e6)
    assert net.delay("w3", "w2", 100) == pytest.approx(0.1 + 100 * 8192 / 10e6)
    assert net.delay("w1", "w2", 100) == pytest.approx(0.0005 + 100 * 8192 / 10e9)  # same site
    link = update.context.node("w3").spec.links[0]
    assert (link.site, link.latency_ms, link.bandwidth_mbps) == ("a", 100, 10)


@pytest.mark.parametrize(
    ("events", "field", "message"),
    [
        (
            [{"slot": 1, "delete": {"kind": "LMService", "name": "zz"}}],
            "events.0.delete.name",
            "no LMService zz",
        ),
        ([{"slot": 1, "nodeDown": {"node": "nope"}}], "events.0.nodeDown.node", "no EdgeNode nope"),
        ([{"slot": 3, "nodeDown": {"node": "w1", "untilSlot": 3}}], "untilSlot", "must be after"),
        ([{"slot": 2, "nodeUp": {"node": "w1"}}], "events.0.nodeUp.node", "w1 is not down"),
        (
            [{"slot": 1, "nodeDown": {"node": "w1"}}, {"slot": 2, "nodeDown": {"node": "w1"}}],
            "events.1.nodeDown.node",
            "already down",
        ),
        (
            [
                {"slot": 1, "delete": {"kind": "EdgeNode", "name": "w1"}},
                {"slot": 2, "nodeUp": {"node": "w1"}},
            ],
            "events.1.nodeUp.node",
            "cannot come back",
        ),
        (
            [{"slot": 1, "link": {"sites": ["a", "zz"], "latencyMs": 1}}],
            "link.sites.1",
            "no site 'zz'",
        ),
        ([{"slot": 1, "link": {"sites": ["a", "b"]}}], "events.0.link", "latencyMs, bandwidthMbps"),
        (
            [{"slot": 1, "link": {"sites": ["a", "a"], "latencyMs": 1}}],
            "events.0.link",
            "two different sites",
        ),
        ([{"slot": 0, "nodeDown": {"node": "w1"}}], "events.0.slot", "greater than or equal to 1"),
        ([{"slot": 1}], "events.0", "exactly one of"),
        (
            [{"slot": 1, "nodeDown": {"node": "w1"}, "nodeUp": {"node": "w1"}}],
            "events.0",
            "(got nodeDown, nodeUp)",
        ),
        (
            [{"slot": 1, "apply": {**lm_service("a"), "kind": "EdgeNode"}}],
            "apply.kind",
            "takes an LMService",
        ),
        (
            [
                {
                    "slot": 1,
                    "apply": lm_service(
                        "a", gpu_s=10.0, cpu_s=20.0, request_kib=100, response_kib=200
                    ),
                }
            ],
            "events.0.apply",
            "unchanged",
        ),
        (
            [{"slot": 1, "apply": lm_service("big", memory_gib=500)}],
            "events.0.apply",
            "fits on no worker",
        ),
        (
            [
                {
                    "slot": 1,
                    "apply": {
                        **lm_service("c"),
                        "spec": {**lm_service("c")["spec"], "gpuSeconds": 1},
                    },
                }
            ],
            "apply.LMService/c.spec.gpuSeconds",
            "unknown field",
        ),
        (
            [
                {"slot": 1, "nodeDown": {"node": "w1"}},
                {"slot": 1, "nodeDown": {"node": "w2"}},
                {"slot": 1, "nodeDown": {"node": "w3"}},
            ],
            "events.2",
            "no worker is left up",
        ),
    ],
)
def test_bad_timeline_is_one_error_naming_the_event(
    make_scenario: Callable[..., Scenario], events: list[dict[str, Any]], field: str, message: str
) -> None:
    with pytest.raises(ManifestError) as err:
        make_scenario(timeline=events)
    assert err.value.source.endswith("timeline.yaml")
    assert field in err.value.field, err.value
    assert message in err.value.message, err.value
    assert "\n" not in str(err.value)


def test_missing_timeline_file_is_named(tmp_path: Path) -> None:
    folder = tmp_path / "s"
    folder.mkdir()
    for f in ("nodes.yaml", "services.yaml"):
        (folder / f).write_text((ROOT / "examples" / "testbed" / f).read_text())
    (folder / "scenario.yaml").write_text(
        "apiVersion: lmedge.io/v1alpha1\nkind: Scenario\nmetadata: {name: s}\ntimeline: tl.yaml\n"
    )
    with pytest.raises(ManifestError, match=r"Scenario\.timeline: no such file"):
        load_scenario(folder)


def test_churn_no_request_vanishes_and_the_loop_replans_on_changes() -> None:
    """Every generated request of the measured slots has exactly one record."""
    folder = ROOT / "examples" / "churn"
    slots, seed = 200, 2
    result = run(RunSpec(folder, PolicyChoice("rr"), seed, slots, keep_history=True)).result
    scenario = load_scenario(folder)
    workload = Workload(scenario, seed)
    # the generator's users ask only for LMs in force at the slot
    expected = {
        f"{seed}-{t}-{r.origin}-{r.lm}"
        for t in range(slots)
        for r in workload.slot(t)
        if scenario.context(t).is_request_class(r.lm)
    }
    measured = result.measured_records()
    ids = [r.id for r in measured]
    assert len(ids) == len(set(ids)) == len(expected)
    assert set(ids) == expected
    outcomes = {r.outcome for r in measured}
    assert {"node_lost", "lm_removed", "success"} <= outcomes
    # no request of lm5 before it is applied (slot 60) or after it is deleted (140)
    assert {r.slot for r in measured if r.lm == "lm5"} == set(range(60, 140))
    # origin worker-3 is down for slots 40-69: each of its requests there is lost
    lost = [r for r in measured if r.origin == "worker-3" and 40 <= r.slot < 70]
    assert lost and all(r.outcome == "node_lost" for r in lost)
    # nothing is served at a node while it is down
    assert not [
        r
        for r in measured
        if r.destination == "worker-6" and 150 <= r.slot < 180 and r.outcome == "success"
    ]
    # the loop re-plans at the changes that need it, not only at epoch starts
    # (epochs start at 0, 50, 100, 150; a link change at 120 needs no new plan)
    planned = {d.slot for d in result.decisions if d.agent == "planner" and d.slot < slots}
    assert planned == {0, 40, 50, 60, 70, 100, 140, 150, 180}
