"""The scenario generator: same seed same bytes, draws within their documented ranges."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from lmedge.errors import ConfigError
from lmedge.sim import load_scenario
from lmedge.sim.generator import Bounds, generate, load_pool

POOL = Path(__file__).parents[3] / "examples" / "metro-1000" / "services.yaml"


@pytest.fixture(scope="module")
def pool() -> list[dict[str, Any]]:
    return load_pool(POOL)


def test_same_seed_same_bytes_other_seed_other_bytes(pool: list[dict[str, Any]]) -> None:
    a, b, c = generate(7, pool), generate(7, pool), generate(8, pool)
    assert a.files == b.files
    assert a.files["nodes.yaml"] != c.files["nodes.yaml"]


def test_written_folder_loads_and_holds_every_draw(
    tmp_path: Path, pool: list[dict[str, Any]]
) -> None:
    folder = generate(3, pool).write(tmp_path / "gen")
    sc = load_scenario(folder)
    drawn = yaml.safe_load((folder / "generated.yaml").read_text())
    workers = [n for n in sc.nodes if n.spec.role == "worker"]
    assert drawn["generator"]["seed"] == 3
    assert drawn["cluster"]["workers"] == len(workers)
    assert [n["node"] for n in drawn["cluster"]["nodes"]] == [n.name for n in workers]
    assert drawn["lms"]["initial"] == [s.name for s in sc.services]
    for node, row in zip(workers, drawn["cluster"]["nodes"], strict=True):
        assert len(node.spec.gpus) == row["gpus"] and node.spec.site == row["site"]


@pytest.mark.parametrize("seed", range(30))
def test_draws_stay_within_bounds(seed: int, pool: list[dict[str, Any]]) -> None:
    bounds = Bounds()
    g = generate(seed, pool, bounds)
    drawn = yaml.safe_load(g.files["generated.yaml"])
    cluster = drawn["cluster"]
    assert 1 <= cluster["sites"] <= bounds.max_sites
    assert bounds.min_workers <= cluster["workers"] <= bounds.max_workers
    assert cluster["nodes"][0]["gpus"] >= 1  # the one sure GPU node
    initial = drawn["lms"]["initial"]
    assert bounds.min_lms <= len(initial) <= bounds.max_lms
    runs_on = {m["metadata"]["name"]: m["spec"]["runsOn"] for m in pool}
    assert {runs_on[lm] for lm in initial} == {"cpu-or-gpu", "gpu-only"}
    load = drawn["load"]
    assert 0.5 <= load["target"] <= 1.2
    # what the files offer is the target load, up to the integer K ranges
    assert load["written"] == pytest.approx(load["target"], abs=0.15)
    assert all(d["writtenPromptsPerSlot"] >= 0.5 for d in load["demand"])


def test_bounds_and_pool_mistakes_are_config_errors(pool: list[dict[str, Any]]) -> None:
    with pytest.raises(ConfigError, match="workers"):
        generate(1, pool, Bounds(min_workers=9, max_workers=4))
    with pytest.raises(ConfigError, match="LMs"):
        generate(1, pool, Bounds(min_lms=1))
    with pytest.raises(ConfigError, match="seed"):
        generate(-1, pool)


def test_a_pool_with_a_token_engine_is_refused(tmp_path: Path) -> None:
    llm = Path(__file__).parents[3] / "examples" / "llm-edge" / "services.yaml"
    with pytest.raises(ConfigError, match="token-engine"):
        load_pool(llm)
