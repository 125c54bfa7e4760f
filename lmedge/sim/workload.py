"""The request workload: a seeded generator, or a recorded trace that replaces it.

Each slot, each origin receives at most one request per LM type, a set of
K ~ U{min..max} prompts (paper §V-B: K in {0..8}, K = 0 means no request),
arriving at a uniform offset within the slot. Phases give bursty traces
(per-phase per-LM K ranges). A slot's requests are drawn from their own
random stream, seeded by (seed, slot), so they are the same whatever the
controller decides and whichever slot is asked for first.

Trace files are CSV (header `slot,origin,lm,prompts,offset_s`) or JSONL (one
object with those keys per line); `record_trace` writes the generated
workload in either format.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lmedge.errors import ManifestError
from lmedge.sim.scenario import Scenario

#: Distinguishes the workload stream from the emulator's other seeded streams.
WORKLOAD_STREAM = 1
TRACE_FIELDS = ("slot", "origin", "lm", "prompts", "offset_s")


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """One request to be submitted: K prompts of one LM at one origin."""

    slot: int
    origin: str
    lm: str
    prompts: int
    offset_s: float


class Workload:
    """The requests of every slot for one scenario and seed (cached per slot)."""

    def __init__(self, scenario: Scenario, seed: int) -> None:
        self._seed = seed
        self._slot_s = scenario.spec.loop.slot_s
        self._spread = scenario.spec.workload.arrival_spread * self._slot_s
        self._origins = scenario.origins
        self._lms = [s.name for s in scenario.services]
        spec = scenario.spec.workload
        self._phases: list[tuple[int, np.ndarray, np.ndarray]] = []
        start = 0
        for phase in spec.phases or []:
            lo, hi = self._ranges(phase.prompts, spec.prompts.min, spec.prompts.max)
            self._phases.append((start, lo, hi))
            start += phase.slots
        if not self._phases:
            lo, hi = self._ranges({}, spec.prompts.min, spec.prompts.max)
            self._phases.append((0, lo, hi))
        self._trace: dict[int, list[RequestSpec]] | None = None
        if scenario.trace_path is not None:
            self._trace = read_trace(scenario.trace_path, scenario)
        self._cache: dict[int, list[RequestSpec]] = {}

    def _ranges(self, per_lm: Any, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        lows = np.array(
            [per_lm[lm].min if lm in per_lm else lo for lm in self._lms], dtype=np.int64
        )
        highs = np.array(
            [per_lm[lm].max if lm in per_lm else hi for lm in self._lms], dtype=np.int64
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
        out = self._trace.get(slot, []) if self._trace is not None else self._generate(slot)
        self._cache[slot] = out
        if len(self._cache) > 4096:
            self._cache.pop(next(iter(self._cache)))
        return out

    def _generate(self, slot: int) -> list[RequestSpec]:
        _, lo, hi = self._phases[self.phase_index(slot)]
        rng = np.random.default_rng([self._seed, WORKLOAD_STREAM, slot])
        shape = (len(self._origins), len(self._lms))
        k = rng.integers(lo, hi + 1, size=shape)
        offsets = rng.random(size=shape) * self._spread
        out: list[RequestSpec] = []
        for i, origin in enumerate(self._origins):
            for j, lm in enumerate(self._lms):
                kk = int(k[i, j])
                if kk > 0:
                    out.append(RequestSpec(slot, origin, lm, kk, float(offsets[i, j])))
        return out


def read_trace(path: Path, scenario: Scenario) -> dict[int, list[RequestSpec]]:
    """Requests by slot from a CSV or JSONL trace; errors name the file and line."""
    rows: list[tuple[int, dict[str, Any]]] = []
    try:
        text = path.read_text()
    except OSError as exc:
        raise ManifestError(str(path), "", f"cannot read trace: {exc}") from exc
    if path.suffix in (".jsonl", ".ndjson"):
        for n, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ManifestError(str(path), f"line {n}", f"not valid JSON: {exc.msg}") from exc
            if not isinstance(obj, dict):
                raise ManifestError(str(path), f"line {n}", "each line must be a JSON object")
            rows.append((n, obj))
    else:
        reader = csv.DictReader(text.splitlines())
        missing = [f for f in TRACE_FIELDS if f not in (reader.fieldnames or [])]
        if missing:
            raise ManifestError(str(path), "line 1", f"header lacks {', '.join(missing)}")
        rows.extend((n, dict(r)) for n, r in enumerate(reader, start=2))
    ctx = scenario.context()
    origins = set(scenario.origins) | {n.name for n in ctx.workers}
    slot_s = scenario.spec.loop.slot_s
    out: dict[int, list[RequestSpec]] = {}
    seen: set[tuple[int, str, str]] = set()
    for n, r in rows:
        where = f"line {n}"
        try:
            slot, prompts = int(r["slot"]), int(r["prompts"])
            origin, lm, offset = str(r["origin"]), str(r["lm"]), float(r.get("offset_s") or 0.0)
        except (KeyError, TypeError, ValueError) as exc:
            raise ManifestError(
                str(path), where, f"needs {', '.join(TRACE_FIELDS)}: {exc}"
            ) from exc
        if slot < 0 or prompts < 0:
            raise ManifestError(str(path), f"{where}: slot/prompts", "must not be negative")
        if origin not in origins:
            raise ManifestError(str(path), f"{where}: origin", f"{origin!r} is not a worker node")
        if not ctx.has_service(lm):
            raise ManifestError(str(path), f"{where}: lm", f"unknown LMService {lm!r}")
        if not 0 <= offset < slot_s:
            raise ManifestError(str(path), f"{where}: offset_s", f"must be in [0, {slot_s:g})")
        if (slot, origin, lm) in seen:
            raise ManifestError(str(path), where, f"second request for ({slot}, {origin}, {lm})")
        seen.add((slot, origin, lm))
        if prompts:
            out.setdefault(slot, []).append(RequestSpec(slot, origin, lm, prompts, offset))
    return out


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
                    f.write(json.dumps(_row(r)) + "\n")
                    count += 1
        else:
            w = csv.writer(f)
            w.writerow(TRACE_FIELDS)
            for t in range(slots):
                for r in wl.slot(t):
                    w.writerow([r.slot, r.origin, r.lm, r.prompts, repr(r.offset_s)])
                    count += 1
    return count


def _row(r: RequestSpec) -> dict[str, Any]:
    return {
        "slot": r.slot,
        "origin": r.origin,
        "lm": r.lm,
        "prompts": r.prompts,
        "offset_s": r.offset_s,
    }
