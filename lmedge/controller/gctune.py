"""Keep Python's cyclic garbage collector off the slot path of a long control loop.

At 1,000 workers a run holds millions of long-lived objects (the scenario,
the emulator's nodes and queues, the context's caches), and each slot
allocates tens of thousands of short-lived ones (arrivals, routes, records).
With CPython's default thresholds every 700 net allocations start a young
collection, every 10th of those a middle one and every 100th a full one
that walks the long-lived objects again: at 1,000 workers that was ~0.6 s
of CPU a slot, a third of the whole loop. `quiet_gc` moves what exists when
the loop starts into the permanent generation (`gc.freeze`: collections no
longer walk it) and raises the thresholds (`THRESHOLDS`) so that a slot's
garbage is collected in a few passes, not hundreds. Reference counting
frees almost everything anyway; the collector is only needed for cycles,
and it still runs.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

#: The collector's thresholds while a loop runs (CPython's defaults: 700, 10, 10):
#: allocations between young collections, then young collections between
#: middle ones, then middle ones between full ones.
THRESHOLDS = (50_000, 50, 1_000)

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
