"""The workload generator, phases and recorded traces."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from lmedge.errors import ManifestError
from lmedge.sim import Workload, load_scenario, record_trace
from lmedge.sim.workload import CACHED_SLOTS

EXAMPLES = Path(__file__).parents[3] / "examples"


def test_k_is_uniform_on_0_to_8_and_about_96_prompts_per_slot() -> None:
    wl = Workload(load_scenario(EXAMPLES / "testbed"), seed=1)
    slots = [wl.slot(t) for t in range(400)]
    ks = [r.prompts for s in slots for r in s]
    assert min(ks) == 1 and max(ks) == 8  # K = 0 means no request
    assert np.mean([sum(r.prompts for r in s) for s in slots]) == pytest.approx(96, rel=0.05)
    assert all(len({(r.origin, r.lm) for r in s}) == len(s) <= 24 for s in slots)
    assert all(0 <= r.offset_s < 30 for s in slots for r in s)


def test_slots_are_independent_of_the_order_they_are_asked_for() -> None:
    sc = load_scenario(EXAMPLES / "testbed")
    forward = [Workload(sc, seed=3).slot(t) for t in range(5)]
    wl = Workload(sc, seed=3)
    backward = [wl.slot(t) for t in reversed(range(5))][::-1]
    assert forward == backward
    assert Workload(sc, seed=4).slot(0) != forward[0]


def test_a_long_run_keeps_a_few_slots_and_draws_an_old_one_again_the_same() -> None:
    sc = load_scenario(EXAMPLES / "testbed")
    wl = Workload(sc, seed=3)
    first = wl.slot(0)
    later = [wl.slot(t) for t in range(1, 100)]
    assert len(wl._cache) == CACHED_SLOTS  # memory flat in the slots, not one list a slot
    assert wl.slot(0) == first and wl.slot(0) is not first  # evicted, drawn again identically
    assert later[-1] == Workload(sc, seed=3).slot(99)


def test_bursty_phases_raise_the_burst_lms() -> None:
    sc = load_scenario(EXAMPLES / "bursty")
    wl = Workload(sc, seed=0)
    lengths = [p.slots for p in sc.spec.workload.phases]
    assert len(lengths) == 3 and all(n >= 2 * sc.spec.loop.epoch_slots for n in lengths)

    def mean_prompts(lm: str, start: int, n: int) -> float:
        return sum(r.prompts for t in range(start, start + n) for r in wl.slot(t) if r.lm == lm) / n

    b, l3 = lengths[0], lengths[1]
    assert mean_prompts("lm3", b, l3) > 1.5 * mean_prompts("lm3", 0, b)
    assert mean_prompts("lm1", b + l3, 100) > 1.5 * mean_prompts("lm1", 0, b)
    assert mean_prompts("lm4", b + l3, 100) > 1.5 * mean_prompts("lm4", b, l3)
    assert wl.phase_index(10**6) == 2  # the last phase continues


def test_origin_prompts_concentrate_one_lm_at_one_origin() -> None:
    plain = load_scenario(EXAMPLES / "testbed")
    others = [o for o in plain.origins if o != "worker-1"]
    skewed = load_scenario(
        EXAMPLES / "testbed",
        workload={
            "originPrompts": {
                "worker-1": {"lm4": {"min": 6, "max": 12}},
                **{o: {"lm4": {"min": 0, "max": 0}} for o in others},
            }
        },
    )
    a, b = Workload(plain, seed=2), Workload(skewed, seed=2)
    for t in range(30):
        lm4 = [r for r in b.slot(t) if r.lm == "lm4"]
        assert [r.origin for r in lm4] == ["worker-1"]
        assert 6 <= lm4[0].prompts <= 12
        assert {r.origin for r in a.slot(t) if r.lm == "lm4"} != {"worker-1"}


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_a_recorded_trace_replays_the_generator(tmp_path: Path, suffix: str) -> None:
    folder = tmp_path / "tb"
    shutil.copytree(EXAMPLES / "testbed", folder)
    sc = load_scenario(folder)
    n = record_trace(sc, seed=9, slots=20, path=folder / f"trace{suffix}")
    replay = Workload(load_scenario(folder, workload={"trace": f"trace{suffix}"}), seed=0)
    generated = Workload(sc, seed=9)
    assert n == sum(len(generated.slot(t)) for t in range(20))
    assert [replay.slot(t) for t in range(20)] == [generated.slot(t) for t in range(20)]
    assert replay.slot(20) == []


@pytest.mark.parametrize(
    ("content", "field", "message"),
    [
        (
            "slot,origin,lm,prompts,offset_s\n0,worker-1,lm9,2,0\n",
            "line 2: lm",
            "unknown LMService",
        ),
        ("slot,origin,lm,prompts,offset_s\n0,control,lm1,2,0\n", "line 2: origin", "not a worker"),
        ("slot,origin,lm,prompts,offset_s\n0,worker-1,lm1,2,31\n", "line 2: offset_s", "[0, 30)"),
        (
            "slot,origin,lm,prompts,offset_s\n-1,worker-1,lm1,2,0\n",
            "line 2: slot/prompts",
            "negative",
        ),
        ("slot,origin,lm,prompts,offset_s\n0,worker-1,lm1,x,0\n", "line 2", "needs slot"),
        ("slot,origin,lm\n", "line 1", "header lacks prompts, offset_s"),
        (
            "slot,origin,lm,prompts,offset_s\n0,worker-1,lm1,2,0\n0,worker-1,lm1,3,1\n",
            "line 3",
            "second request",
        ),
    ],
    ids=["lm", "origin", "offset", "negative", "not-int", "header", "duplicate"],
)
def test_bad_trace_rows_name_file_and_line(
    tmp_path: Path, content: str, field: str, message: str
) -> None:
    folder = tmp_path / "tb"
    shutil.copytree(EXAMPLES / "testbed", folder)
    (folder / "t.csv").write_text(content)
    with pytest.raises(ManifestError) as err:
        load_scenario(folder, workload={"trace": "t.csv"})
    assert err.value.source.endswith("t.csv")
    assert err.value.field == field and message in err.value.message


def test_bad_jsonl_line(tmp_path: Path) -> None:
    folder = tmp_path / "tb"
    shutil.copytree(EXAMPLES / "testbed", folder)
    (folder / "t.jsonl").write_text(
        '{"slot": 0, "origin": "worker-1", "lm": "lm1", "prompts": 1}\n{oops\n'
    )
    with pytest.raises(ManifestError, match="line 2: not valid JSON"):
        load_scenario(folder, workload={"trace": "t.jsonl"})
