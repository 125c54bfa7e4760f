"""Model routing end to end: a request class served by lm1 or lm2 (examples/model-routing).

`cema` chooses (node, model) per batch by predicted quality, cost, energy
and completion time; on the recalibrated testbed gpt2-large (lm2, quality
prior 0.9) is fast enough that it wins every batch, a model an LM-only router
never picks. `rr` (a router that knows only LMs) serves the class with its
first model, lm1. Records keep `lm` = the class and
`model` = the serving LM, so per-class metrics name the class.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from lmedge.store import open_store

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = ROOT / "examples" / "model-routing"


def simulate(policy: str, store: Path) -> dict[str, object]:
    env = {**os.environ, "LMEDGE_STORE": str(store)}
    args = ["-f", str(SCENARIO), "--policy", policy, "--slots", "60", "--seed", "1", "--json"]
    proc = subprocess.run(
        [sys.executable, "-c", "from lmedge.cli import main; main()", "simulate", *args],
        cwd=store.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    out: dict[str, object] = json.loads(proc.stdout)
    return out


def served_by(store: Path) -> Counter[tuple[str, str | None]]:
    with open_store(str(store)) as s:
        (run,) = s.runs()
        return Counter((r.lm, r.model) for r in s.requests(run.id))


@pytest.mark.parametrize(
    ("policy", "models", "required"),
    [("cema", {"lm1", "lm2"}, "lm2"), ("rr", {"lm1"}, "lm1")],
    ids=["cema", "rr"],
)
def test_text_generation_class_is_served_by_the_routers_choice_of_model(
    tmp_path: Path, policy: str, models: set[str], required: str
) -> None:
    store = tmp_path / "store"
    summary = simulate(policy, store)
    per_lm = {row["lm"]: row for row in summary["per_lm"]}  # type: ignore[attr-defined]
    # lm1 and lm2 get no requests of their own (they serve the class): no empty rows
    assert list(per_lm) == ["lm3", "lm4", "text-generation"]
    assert per_lm["text-generation"]["arrivals"] > 0
    counts = served_by(store)
    chosen = {m for (lm, m) in counts if lm == "text-generation"}
    assert required in chosen
    assert chosen <= models
    assert {m for (lm, m) in counts if lm in ("lm3", "lm4")} == {None}
    assert set(counts) <= {("text-generation", m) for m in models} | {
        ("lm3", None),
        ("lm4", None),
    }
