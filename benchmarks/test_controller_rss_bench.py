"""The long-running controller's memory (run by `make bench`; issue 12 item 6).

`ma` (rule agents) on the emulated `testbed`, 10,000 slots (83 hours of
30-s slots), the loop as the controller runs it on a cluster:
`keep_history=False` and every record, decision and memory case handed to a
store each slot. The store here is a sink that encodes each document as the
store does (`to_document`) and keeps none: on a cluster the store is another
process (FerretDB), and its size is not the controller's. Records reach the
loop one slot at a time (the backend's `drain_records`).

Measured: the process's resident set (VmRSS, after a full GC) after 100 and
after 10,000 slots. Target: < 10% growth. The emulator runs in the same
process, so its own state counts too; the number bounds the controller's
growth from above: its workload cache holds up to 4,096 slots of request
specs, about 8 MiB, filled by slot 4,096. Measured (loaded 2-core machine):
162,240 KiB after 100 slots, 174,936 after 5,000, 177,424 after 10,000:
+9.4% overall, +1.4% from 5,000 to 10,000 (when the emulator's cache is
full). Written to reports/bench-controller-rss.json.
"""

from __future__ import annotations

import gc
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from lmedge.api import Decision, MemoryCase, NodeTelemetry, RequestRecord
from lmedge.backends.emulated.backend import EmulatedBackend
from lmedge.controller.assembly import PolicyChoice, build_plugins
from lmedge.controller.loop import ControlLoop
from lmedge.sim.scenario import load_scenario
from lmedge.store.documents import to_document

pytestmark = pytest.mark.bench

ROOT = Path(__file__).resolve().parents[1]
TESTBED = ROOT / "examples" / "testbed"
EARLY, LATE = 100, 10_000
TARGET_GROWTH = 0.10


class EncodingSink:
    """A store stand-in on the controller's side: encodes every document, keeps a count."""

    def __init__(self) -> None:
        self.documents = 0

    def _take(self, models: Sequence[Any]) -> None:
        for m in models:
            to_document(m)
        self.documents += len(models)

    def record_requests(self, records: Sequence[RequestRecord]) -> None:
        self._take(records)

    def record_decisions(self, decisions: Sequence[Decision[Any]]) -> None:
        self._take(decisions)

    def record_telemetry(self, snapshots: Sequence[NodeTelemetry]) -> None:
        self._take(snapshots)

    def record_memory(self, case: MemoryCase) -> None:
        self._take([case])


def _rss_kib() -> int:
    gc.collect()
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS in /proc/self/status")


@pytest.mark.timeout(3600)  # 10,000 slots: minutes on a loaded machine
def test_controller_memory_does_not_grow_with_the_run() -> None:
    backend = EmulatedBackend(load_scenario(TESTBED), seed=1)
    plugins = build_plugins(PolicyChoice("ma"), backend.context(), 1)
    sink: Any = EncodingSink()
    loop = ControlLoop(
        backend, plugins, run_id="rss", seed=1, store=sink, keep_history=False, telemetry=False
    )
    started = time.perf_counter()
    samples: dict[int, int] = {}
    for slot in range(LATE):
        loop.step(slot)
        if slot + 1 in (EARLY, 1000, 2000, 5000, LATE):
            samples[slot + 1] = _rss_kib()
            elapsed = time.perf_counter() - started
            print(f"slot {slot + 1}: RSS {samples[slot + 1]} KiB, {elapsed:.0f} s", flush=True)
    loop.close()
    growth = samples[LATE] / samples[EARLY] - 1
    report = {
        "scenario": "testbed",
        "policy": "ma",
        "rss_kib": samples,
        "growth": round(growth, 4),
        "documents_stored": sink.documents,
        "epochs_kept": len(loop.result.epochs),
        "records_kept": len(loop.result.records),
        "wall_s": round(time.perf_counter() - started, 1),
    }
    out = ROOT / "reports" / "bench-controller-rss.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"controller RSS {samples} KiB: {growth:+.1%} from {EARLY} to {LATE} slots; {out}")
    assert loop.result.records == [] and loop.result.decisions == []
    assert growth < TARGET_GROWTH, report
