"""Small exact scenarios for the emulator tests, written as real manifest files.

Defaults make timing exact: no service-time jitter, no utilization slowdown,
a cold start pinned near 1 s, one site with negligible links. Requests come
from a trace file, so each test states exactly what arrives when.
"""

from __future__ import annotations

import csv
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from lmedge.api import LMPlacement, Placement, RequestRecord, Route, RoutingMap
from lmedge.api.manifests import API
from lmedge.backends.emulated import EmulatedBackend, load_scenario
from lmedge.sim import Scenario
from lmedge.sim.synthetic import edge_node, lm_service, scenario_doc, write_scenario

EXACT_EMULATION: dict[str, Any] = {
    "coldStart": {"medianS": 1.0, "p95S": 1.001, "maxS": 1.002},
    "serviceTimeCv": 0.0,
    "cpuSlowdown": {"eta0": 1.0, "beta": 0.0},
    "memorySlowdown": {"eta0": 1.0, "beta": 0.0},
    "gpuSlowdown": {"eta0": 1.0, "beta": 0.0},
}

Row = tuple[int, str, str, int, float]  # slot, origin, lm, prompts, offset_s


def default_nodes() -> list[dict[str, Any]]:
    return [
        edge_node("w1", gpus=1, site="a", links=[("b", 100, 20)]),
        edge_node("w2", gpus=2, site="a", links=[("b", 100, 20)]),
        edge_node("w3", cores=24, memory_gib=32, site="b", links=[("a", 100, 20)]),
    ]


def default_services() -> list[dict[str, Any]]:
    return [
        lm_service("a", gpu_s=10.0, cpu_s=20.0, request_kib=100, response_kib=200),
        lm_service("b", gpu_s=10.0, cpu_s=20.0),
        lm_service("g", gpu_s=4.0, runs_on="gpu-only", vram_gib=4),
    ]


@pytest.fixture
def make_scenario(tmp_path: Path) -> Callable[..., Scenario]:
    """make_scenario(rows, nodes=..., services=..., emulation=..., loop=..., timeline=[events])."""

    def make(
        rows: Sequence[Row] = (),
        *,
        nodes: Sequence[dict[str, Any]] | None = None,
        services: Sequence[dict[str, Any]] | None = None,
        emulation: dict[str, Any] | None = None,
        loop: dict[str, Any] | None = None,
        name: str = "case",
        timeline: Sequence[dict[str, Any]] | None = None,
    ) -> Scenario:
        folder = tmp_path / name
        folder.mkdir(parents=True, exist_ok=True)
        with (folder / "trace.csv").open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["slot", "origin", "lm", "prompts", "offset_s"])
            w.writerows(rows)
        doc = scenario_doc(
            name,
            loop={"slotS": 30, "tauS": 900, **(loop or {})},
            emulation={**EXACT_EMULATION, **(emulation or {})},
            workload={"trace": "trace.csv"},
        )
        if timeline is not None:
            tl = {"apiVersion": API, "kind": "Timeline", "metadata": {"name": name}}
            (folder / "timeline.yaml").write_text(yaml.safe_dump({**tl, "events": list(timeline)}))
            doc["timeline"] = "timeline.yaml"
        write_scenario(
            folder, nodes or default_nodes(), services or default_services(), scenario=doc
        )
        return load_scenario(folder)

    return make


def place(backend: EmulatedBackend, node: str, *lms: tuple[str, str, float, int]) -> list[str]:
    """Apply a placement of (lm, mode, cores, vgpus) on `node`; return what was done."""
    res = backend.apply_placement(
        Placement(
            node=node,
            lms=[LMPlacement(lm=lm, mode=m, cpu_cores=c, vgpus=v) for lm, m, c, v in lms],  # type: ignore[arg-type]
        )
    )
    assert not res.errors, res.errors
    return res.started + res.resized + res.stopped


def route(backend: EmulatedBackend, slot: int, *routes: tuple[str, str, str]) -> None:
    backend.publish_routing(
        slot, RoutingMap(routes=[Route(origin=o, lm=lm, destination=d) for o, lm, d in routes])
    )


def run_all(backend: EmulatedBackend, until: float) -> list[RequestRecord]:
    backend.clock.sleep_until(until)
    return backend.drain_records()
