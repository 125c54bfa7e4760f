"""`quiet_gc`: the collector is set up for the block and put back after it."""

from __future__ import annotations

import gc
import threading
import weakref

import pytest

from lmedge.controller.gctune import THRESHOLDS, quiet_gc, slot_end


def test_the_block_freezes_and_raises_the_young_threshold_then_restores_both() -> None:
    before = gc.get_threshold()
    assert gc.get_freeze_count() == 0
    with quiet_gc():
        assert gc.get_threshold() == tuple(
            max(a, b) for a, b in zip(THRESHOLDS, before, strict=True)
        )
        assert gc.get_freeze_count() > 0
        assert gc.isenabled()  # cycles are still collected
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


def test_nested_and_concurrent_blocks_restore_once_the_outermost_ends() -> None:
    before = gc.get_threshold()
    inner_done = threading.Event()

    def inner() -> None:
        with quiet_gc():
            pass
        inner_done.set()

    with quiet_gc():
        t = threading.Thread(target=inner)
        t.start()
        t.join()
        assert inner_done.is_set()
        # the other block has ended; this one still holds the collector set up
        assert gc.get_threshold() == tuple(
            max(a, b) for a, b in zip(THRESHOLDS, before, strict=True)
        )
        assert gc.get_freeze_count() > 0
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


def test_a_failing_block_still_restores_the_collector() -> None:
    before = gc.get_threshold()
    with pytest.raises(RuntimeError, match="boom"), quiet_gc():
        raise RuntimeError("boom")
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


def test_cyclic_garbage_made_in_the_block_is_still_collected() -> None:
    class Node:
        other: Node | None = None

    collected = threading.Event()
    with quiet_gc():
        a, b = Node(), Node()
        a.other, b.other = b, a
        weakref.finalize(a, collected.set)
        del a, b
        gc.collect()
        assert collected.is_set()


class _Cycle:
    other: _Cycle | None = None


def _cycle(freed: threading.Event) -> _Cycle:
    a, b = _Cycle(), _Cycle()
    a.other, b.other = b, a
    weakref.finalize(a, freed.set)
    return a


def test_slot_end_frees_the_cycles_a_slot_left() -> None:
    freed = threading.Event()
    with quiet_gc():
        _cycle(freed)  # garbage at once, but only the collector can free a cycle
        slot_end()
        assert freed.is_set()


def test_the_full_slot_end_frees_cycles_that_outlived_their_slot() -> None:
    freed = threading.Event()
    with quiet_gc():
        kept = _cycle(freed)
        slot_end()  # still referenced: it moves to the old generation
        assert not freed.is_set()
        del kept
        slot_end(full=True)
        assert freed.is_set()


def test_slot_end_outside_a_block_leaves_the_collector_alone() -> None:
    started: list[int] = []

    def seen(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started.append(info["generation"])

    enabled = gc.isenabled()
    gc.disable()  # no automatic collection in the window; an explicit one still runs
    gc.callbacks.append(seen)
    try:
        slot_end(full=True)
    finally:
        gc.callbacks.remove(seen)
        if enabled:
            gc.enable()
    assert started == []
