"""Loading scenarios: the examples load; every bad input is one clear error."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from lmedge.errors import InfeasibleScenarioError, ManifestError
from lmedge.sim import load_scenario

EXAMPLES = Path(__file__).parents[3] / "examples"


@pytest.mark.parametrize(
    ("name", "workers"),
    [("testbed", 6), ("testbed-expanded", 8), ("bursty", 6), ("large", 120)],
)
def test_examples_load(name: str, workers: int) -> None:
    sc = load_scenario(EXAMPLES / name)
    assert len(sc.context().workers) == workers
    assert [s.name for s in sc.services] == ["lm1", "lm2", "lm3", "lm4"]


def test_testbed_values_come_from_the_paper() -> None:
    sc = load_scenario(EXAMPLES / "testbed" / "scenario.yaml")
    loop, cold = sc.spec.loop, sc.spec.emulation.cold_start
    assert (loop.slot_s, loop.epoch_slots, loop.tau_s, loop.lam) == (30, 50, 900, 0.5)
    assert (cold.median_s, cold.p95_s, cold.max_s) == (9.34, 12.23, 13.58)
    assert (sc.spec.workload.prompts.min, sc.spec.workload.prompts.max) == (0, 8)


def test_overrides_accept_snake_and_camel_case() -> None:
    sc = load_scenario(EXAMPLES / "testbed", loop={"tau_s": 60}, workload={"prompts": {"max": 2}})
    assert sc.spec.loop.tau_s == 60 and sc.spec.workload.prompts.max == 2
    assert load_scenario(EXAMPLES / "testbed", loop={"slotS": 10}).context().loop.slot_s == 10


@pytest.fixture
def testbed(tmp_path: Path) -> Path:
    dst = tmp_path / "tb"
    shutil.copytree(EXAMPLES / "testbed", dst)
    return dst


def _edit(path: Path, fn: object) -> None:
    docs = list(yaml.safe_load_all(path.read_text()))
    fn(docs)  # type: ignore[operator]
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False))


@pytest.mark.parametrize(
    ("overrides", "field", "message"),
    [
        ({"loop": {"tauS": -1}}, "Scenario.loop.tauS", "greater than 0"),
        ({"loop": {"epochSlots": 0}}, "Scenario.loop.epochSlots", "greater than or equal to 1"),
        (
            {"emulation": {"coldStart": {"p95S": 20}}},
            "Scenario.emulation.coldStart",
            "medianS < p95S",
        ),
        (
            {"emulation": {"cpuParallelFraction": 1.5}},
            "Scenario.emulation.cpuParallelFraction",
            "1",
        ),
        ({"emulation": {"gpuBinding": "random"}}, "Scenario.emulation.gpuBinding", "spread"),
        ({"workload": {"prompts": {"min": 5, "max": 2}}}, "Scenario.workload.prompts", "exceeds"),
        ({"workload": {"arrivalSpred": 1}}, "Scenario.workload.arrivalSpred", "unknown field"),
        ({"kind": "Scenarios"}, "Scenario.kind", "Scenario"),
        (
            {"workload": {"phases": [{"name": "x", "slots": 5, "prompts": {"lm9": {"max": 1}}}]}},
            "Scenario.workload.phases.0.prompts.lm9",
            "unknown LMService",
        ),
        ({"workload": {"origins": ["control"]}}, "Scenario.workload.origins.0", "not a worker"),
        ({"workload": {"trace": "nope.csv"}}, "Scenario.workload.trace", "no such file"),
        ({"emulation": {"gpuDemand": {"lm9": 0.5}}}, "Scenario.emulation.gpuDemand.lm9", "unknown"),
        ({"emulation": {"gpuDemand": {"lm1": 0}}}, "Scenario.emulation.gpuDemand.lm1", "(0, 1]"),
        (
            {"workload": {"originPrompts": {"control": {"lm1": {"max": 2}}}}},
            "Scenario.workload.originPrompts.control",
            "not an origin",
        ),
        (
            {"workload": {"originPrompts": {"worker-1": {"lm9": {"max": 2}}}}},
            "Scenario.workload.originPrompts.worker-1.lm9",
            "neither an LMService nor a request class",
        ),
        (
            {"workload": {"originPrompts": {"worker-1": {"lm1": {"min": 3, "max": 2}}}}},
            "Scenario.workload.originPrompts.worker-1.lm1",
            "exceeds",
        ),
    ],
    ids=[
        "negative-tau",
        "zero-epoch",
        "cold-start-order",
        "fraction-above-1",
        "bad-binding",
        "prompt-range",
        "typo",
        "kind",
        "phase-lm",
        "origin-control",
        "trace-missing",
        "demand-lm",
        "demand-range",
        "origin-prompts-not-an-origin",
        "origin-prompts-unknown-lm",
        "origin-prompts-range",
    ],
)
def test_invalid_parameters_name_file_and_field(
    testbed: Path, overrides: dict[str, object], field: str, message: str
) -> None:
    with pytest.raises(ManifestError) as err:
        load_scenario(testbed, **overrides)
    assert err.value.source == str(testbed / "scenario.yaml")
    assert err.value.field == field
    assert message in err.value.message


def test_malformed_manifest_names_file_and_field(testbed: Path) -> None:
    def negative_cores(docs: list[dict[str, object]]) -> None:
        docs[2]["spec"]["cpuCores"] = -4  # type: ignore[index]

    _edit(testbed / "nodes.yaml", negative_cores)
    with pytest.raises(ManifestError) as err:
        load_scenario(testbed)
    assert err.value.source.endswith("nodes.yaml")
    assert err.value.field == "document 3: EdgeNode/worker-2.spec.cpuCores"


def test_not_yaml(testbed: Path) -> None:
    (testbed / "scenario.yaml").write_text("kind: [unclosed\n")
    with pytest.raises(ManifestError, match="not valid YAML"):
        load_scenario(testbed)


def test_an_lm_that_fits_nowhere_is_infeasible(testbed: Path) -> None:
    def huge(docs: list[dict[str, object]]) -> None:
        docs[3]["spec"]["deploymentMemoryGib"] = 64  # type: ignore[index]

    _edit(testbed / "services.yaml", huge)
    with pytest.raises(InfeasibleScenarioError, match=r"LMService lm4 fits on no node.*64 GiB"):
        load_scenario(testbed)


def test_gpu_only_lm_without_gpu_nodes_is_infeasible(testbed: Path) -> None:
    def no_gpus(docs: list[dict[str, object]]) -> None:
        for d in docs:
            d["spec"].pop("gpus", None)  # type: ignore[attr-defined]

    _edit(testbed / "nodes.yaml", no_gpus)
    with pytest.raises(InfeasibleScenarioError, match="lm3 fits on no node: it needs a GPU node"):
        load_scenario(testbed)


def test_sites_without_a_link_are_rejected(testbed: Path) -> None:
    def unlink(docs: list[dict[str, object]]) -> None:
        for d in docs:
            d["spec"]["links"] = [lk for lk in d["spec"].get("links", []) if lk["site"] != "mshed"]  # type: ignore[index, attr-defined]
            if d["spec"]["site"] == "mshed":  # type: ignore[index]
                d["spec"]["links"] = []  # type: ignore[index]

    _edit(testbed / "nodes.yaml", unlink)
    with pytest.raises(ManifestError, match="no link between sites"):
        load_scenario(testbed)


def test_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match="no such scenario folder or file"):
        load_scenario(tmp_path / "nothing")


@pytest.mark.parametrize(
    ("old", "new", "field", "message"),
    [
        ("slotS: 30 ", "slotS: '30' ", "Scenario.loop.slotS", "valid number"),
        ("slotS: 30 ", "slot_s: 30 ", "Scenario.loop.slot_s", "unknown field"),
        ("tauS: 900 ", "tauS: .inf ", "Scenario.loop.tauS", "not a JSON number"),
        ("tauS: 900 ", "tauS: 900\n  tauS: 60 ", "line ", "duplicate key 'tauS'"),
    ],
    ids=["quoted-number", "snake-case", "infinite", "duplicate-key"],
)
def test_scenario_file_is_read_as_strictly_as_a_manifest(
    testbed: Path, old: str, new: str, field: str, message: str
) -> None:
    f = testbed / "scenario.yaml"
    text = f.read_text()
    assert old in text
    f.write_text(text.replace(old, new, 1))
    with pytest.raises(ManifestError) as err:
        load_scenario(testbed)
    assert err.value.source == str(f)
    assert field in err.value.field
    assert message in err.value.message
    assert "\n" not in str(err.value)
