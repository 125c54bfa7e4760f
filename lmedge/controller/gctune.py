"""Keep Python's cyclic garbage collector off the slot path of a long control loop.

At 1,000 workers a run holds millions of long-lived objects (the scenario,
the emulator's nodes and queues, the context's caches), and each slot
allocates tens of thousands of short-lived ones (arrivals, routes, records).
With CPython's default thresholds every 700 net allocations start a young
collection, every 10th of those a middle one and every 100th a full one
that walks the long-lived objects again: at 1,000 workers that was ~0.6 s
of CPU a slot, a third of the whole loop. `quiet_gc` moves what exists when
the loop starts into the permanent generation (`gc.freeze`: collections no
longer walk it) and raises the thresholds (`THRESHOLDS`) so far that the
collector seldom starts on its own: the loop collects at each slot's end
instead (`slot_end`), after actuating and before the slot's wait, when a
controller on a cluster is idle. Reference counting frees almost
everything anyway; the collector is only needed for cycles (an exception's
traceback, an HTTP client's state), and it still runs once a slot.

Measured at 1,000 workers (metro-1000, `ma`, 200 slots): with young
collections every 50,000 allocations the collector took ~130 ms a slot in
four passes that fell anywhere, in the decisions too. Collected at the
slot's end it took ~75 ms there, outside the decision; with the slot's
placements mostly shared objects (the rule deployer's), 84 ms a slot over
the whole run, the epoch's full collection included. About 100,000 objects
outlive a slot there (the emulator's jobs and pending events, the
placements, the epoch's metric rows), and a young collection walks each
once whatever the threshold, so what pays is fewer survivors, not rarer
collections. The loop lets the slot's observation go before collecting.

At 10,000 workers (metro-10000, `ma`) a slot allocates 1-2 million objects
that outlive it at least until its end (100,000 arrivals and routes, the
routed snapshot, the emulator's queued requests): with young collections
every 1,000,000 allocations one fell in each slot, mostly in the router,
walking ~1 million survivors (0.5-0.8 s of CPU), and the slot's end walked
most of them again (0.5-0.9 s). At 5,000,000 none falls in the slot: the
serial control plane took 2.0-2.2 s of CPU a slot instead of 2.6-3.3 s (the
same run at the same moment), the slot's-end collection 0.5-0.7 s, peak RSS
the same. Freezing once more after the first slot (the plan, the context's
caches) helped the next slot only.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

#: The collector's thresholds while a loop runs (CPython's defaults: 700, 10, 10):
#: allocations between young collections, then young collections between
#: middle ones, then middle ones between full ones. The young one is only a
#: backstop for a slot that allocates far more than a 10,000-node slot does
#: (1-2 million objects).
THRESHOLDS = (5_000_000, 1_000, 1_000)

_lock = threading.Lock()
_depth = 0
_saved: tuple[int, int, int] | None = None


@contextmanager
def quiet_gc() -> Iterator[None]:
    """Freeze the objects that exist now and collect young garbage less often, for the block.

    Re-entrant and thread-safe: the outermost block sets the collector up and
    puts the thresholds back (and unfreezes) when it ends.
    """
    global _depth, _saved
    with _lock:
        if _depth == 0:
            _saved = gc.get_threshold()
            # no gc.collect() first: it would walk everything once per run, and
            # garbage frozen with the rest is freed when the block ends
            gc.freeze()
            gc.set_threshold(*(max(new, old) for new, old in zip(THRESHOLDS, _saved, strict=True)))
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _saved is not None:
                gc.set_threshold(*_saved)
                gc.unfreeze()
                _saved = None


def slot_end(*, full: bool = False) -> None:
    """Collect what a slot left, inside a `quiet_gc` block (a no-op outside one).

    The young generations are walked once and their survivors move to the
    old one, which young collections skip. `full` also walks the old
    generation (the loop asks for it once an epoch), so that cycles which
    outlived their slot are freed in a long run too; what `quiet_gc` froze
    is never walked.
    """
    if _depth:
        gc.collect(2 if full else 1)
