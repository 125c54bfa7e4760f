"""The request workload: a seeded generator, or a recorded trace that replaces it.

Each slot, each origin receives at most one request per request class (by
default each LM is its own class; `workload.classes` may name classes several
LMs serve instead), a set of
K ~ U{min..max} prompts (paper §V-B: K in {0..8}, K = 0 means no request),
arriving at a uniform offset within the slot. Phases give bursty traces
(per-phase per-LM K ranges). A slot's requests are drawn from their own
random stream, seeded by (seed, slot), so they are the same whatever the
controller decides and whichever slot is asked for first. Per-origin demand
(`workload.originPrompts`) gives chosen (origin, class) cells their own K
range in every phase; a scenario without it generates what it always did.

`record_trace` writes the generated workload as a trace file (CSV or JSONL,
see `trace.py`) that can replace the generator to replay the same arrivals.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import numpy as np

from lmedge.sim.radio import server_positions
from lmedge.sim.scenario import Scenario
from lmedge.sim.trace import TRACE_FIELDS, RequestSpec, trace_row

#: Distinguishes the workload stream from the emulator's other seeded streams.
WORKLOAD_STREAM = 1
#: Slots whose requests `Workload` keeps. A slot's rows are asked for at its own
#: boundary (the backend's refresh, the arrivals, the emulator's submits), never
#: long after, and an older slot is drawn again the same; keeping every slot
#: grew a 1,000-worker run by ~1 MB a slot.
CACHED_SLOTS = 8


class Workload:
    """The requests of every slot for one scenario and seed (cached per slot)."""

    def __init__(self, scenario: Scenario, seed: int) -> None:
        self._seed = seed
        self._slot_s = scenario.spec.loop.slot_s
        self._spread = scenario.spec.workload.arrival_spread * self._slot_s
        self._origins = scenario.origins
        # request classes; by default the LM names (each LM its own class)
        self._lms = scenario.request_classes
        spec = scenario.spec.workload
        self._per_origin = spec.origin_prompts
        self._phases: list[tuple[int, np.ndarray, np.ndarray]] = []
        start = 0
        for phase in spec.phases or []:
            lo, hi = self._ranges(phase.prompts, spec.prompts.min, spec.prompts.max)
            self._phases.append((start, lo, hi))
            start += phase.slots
        if not self._phases:
            lo, hi = self._ranges({}, spec.prompts.min, spec.prompts.max)
            self._phases.append((0, lo, hi))
        self._trace = scenario.trace
        self._users = spec.users
        if self._users is not None:
            workers = [n.name for n in scenario.nodes if n.spec.role == "worker"]
            at = server_positions(workers, self._users.area_m)
            self._servers = (workers, np.array([at[w] for w in workers]))
        self._cache: dict[int, list[RequestSpec]] = {}

    def _ranges(self, per_lm: Any, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        """(origins x classes) K bounds: the origin's own range, else the phase's, else `lo..hi`."""

        def bound(origin: str, lm: str, attr: str, default: int) -> int:
            own = self._per_origin.get(origin, {})
            if lm in own:
                return int(getattr(own[lm], attr))
            return int(getattr(per_lm[lm], attr)) if lm in per_lm else default

        lows = np.array(
            [[bound(o, lm, "min", lo) for lm in self._lms] for o in self._origins], dtype=np.int64
        )
        highs = np.array(
            [[bound(o, lm, "max", hi) for lm in self._lms] for o in self._origins], dtype=np.int64
        )
        return lows, highs

    def phase_index(self, slot: int) -> int:
        """Index of the phase `slot` falls in (the last phase continues forever)."""
        idx = 0
        for i, (start, _, _) in enumerate(self._phases):
            if slot >= start:
                idx = i
        return idx

    def slot(self, slot: int) -> list[RequestSpec]:
        """Requests arriving in `slot`, ordered by origin, then LM (manifest order)."""
        cached = self._cache.get(slot)
        if cached is not None:
            return cached
        if self._trace is not None:
            out = self._trace.get(slot, [])
        elif self._users is not None:
            out = self._generate_users(slot)
        else:
            out = self._generate(slot)
        self._cache[slot] = out
        if len(self._cache) > CACHED_SLOTS:
            self._cache.pop(next(iter(self._cache)))
        return out

    def _generate(self, slot: int) -> list[RequestSpec]:
        _, lo, hi = self._phases[self.phase_index(slot)]
        rng = np.random.default_rng([self._seed, WORKLOAD_STREAM, slot])
        shape = (len(self._origins), len(self._lms))
        k = rng.integers(lo, hi + 1, size=shape)
        offsets = rng.random(size=shape) * self._spread
        # the cells with requests, in row-major (origin, then LM) order
        rows, cols = np.nonzero(k > 0)
        origins, lms = self._origins, self._lms
        return [
            RequestSpec(slot, origins[i], lms[j], kk, off)
            for i, j, kk, off in zip(
                rows.tolist(),
                cols.tolist(),
                k[rows, cols].tolist(),
                offsets[rows, cols].tolist(),
                strict=True,
            )
        ]

    def _generate_users(self, slot: int) -> list[RequestSpec]:
        """One request per active user, in user order: a uniform class, a uniform
        position in the area, its nearest server as origin (ties: manifest order)."""
        users = self._users
        assert users is not None
        rng = np.random.default_rng([self._seed, WORKLOAD_STREAM, slot])
        n = users.count
        active = rng.random(n) < users.activity
        cls = rng.integers(0, len(self._lms), size=n)
        pos = rng.random((n, 2)) * users.area_m
        offsets = rng.random(n) * self._spread
        names, at = self._servers
        nearest = np.argmin(((pos[:, None, :] - at[None, :, :]) ** 2).sum(axis=2), axis=1)
        return [
            RequestSpec(slot, names[s], self._lms[c], 1, off, user=u, x_m=float(x), y_m=float(y))
            for u, (s, c, off, (x, y)) in enumerate(
                zip(nearest.tolist(), cls.tolist(), offsets.tolist(), pos.tolist(), strict=True)
            )
            if active[u]
        ]


def record_trace(scenario: Scenario, seed: int, slots: int, path: Path) -> int:
    """Write the generated workload of `slots` slots to `path` (.csv or .jsonl).

    Returns the number of requests written. The file can then replace the
    generator (`workload.trace`) to replay exactly the same arrivals.
    """
    wl = Workload(scenario, seed)
    count = 0
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        if path.suffix in (".jsonl", ".ndjson"):
            for t in range(slots):
                for r in wl.slot(t):
                    f.write(json.dumps(trace_row(r)) + "\n")
                    count += 1
        else:
            w = csv.writer(f)
            w.writerow(TRACE_FIELDS)
            for t in range(slots):
                for r in wl.slot(t):
                    w.writerow([r.slot, r.origin, r.lm, r.prompts, repr(r.offset_s)])
                    count += 1
    return count
