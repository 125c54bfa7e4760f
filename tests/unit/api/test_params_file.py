"""Plugin-parameter files: what calibrate writes, simulate/bench/controller read back."""

from __future__ import annotations

from pathlib import Path

import pytest

from lmedge.api.params_file import dump_params, merge_params, parse_params, read_params
from lmedge.errors import ConfigError


def test_a_dumped_file_reads_back_to_the_same_parameters() -> None:
    params = {"deployer": {"p1": 0.15, "alpha_gpu": {"lm1": 5.8, "lm4": 3.02}, "v": 1}}
    text = dump_params(params, {"deployer": "lyapunov"}, header="calibrated\n\non testbed")
    assert text.startswith("# calibrated\n#\n# on testbed\n")
    back = parse_params(text, "p.yaml")
    assert back.params == params
    assert back.plugins == {"deployer": "lyapunov"}


def test_parameters_go_only_to_the_plugin_they_are_for() -> None:
    f = parse_params("plugins: {deployer: lyapunov}\ndeployer: {p1: 1}\nrouter: {x: 2}\n", "f")
    assert f.for_tiers({"deployer": "lyapunov", "router": "rr"}) == {
        "deployer": {"p1": 1},
        "router": {"x": 2},
    }
    assert f.for_tiers({"deployer": "random", "router": "rr"}) == {"router": {"x": 2}}
    assert f.mismatches({"deployer": "random"}) == [
        "deployer parameters are for 'lyapunov', not 'random'"
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("deployr: {p1: 1}\n", "f.yaml: 'deployr' is not a tier; expected planner, router"),
        ("- deployer\n", "f.yaml: expected a mapping of tiers"),
        ("deployer: [1, 2]\n", "f.yaml: deployer must map parameter names to values, got list"),
        ("deployer: {p1: 1, p1: 2}\n", "duplicate key 'p1'"),
        ("deployer: {p1: .nan}\n", "f.yaml: deployer.p1: nan is not a finite number"),
        ("deployer: {alpha_gpu: {lm1: .inf}}\n", "deployer.alpha_gpu.lm1: inf is not a finite"),
        ("deployer: {p1: 1}\n---\nrouter: {}\n", "one document expected, found 2"),
        ("deployer: {p1: [1\n", "f.yaml: not valid YAML"),
        ("plugins: {deployr: lyapunov}\n", "plugins must map tiers"),
    ],
)
def test_bad_files_are_one_clear_error(text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as exc:
        parse_params(text, "f.yaml")
    assert expected in str(exc.value)
    assert "\n" not in str(exc.value)


def test_an_empty_file_is_no_parameters() -> None:
    assert parse_params("# nothing\n", "f").params == {}


def test_a_missing_file_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"--params: .*absent\.yaml does not exist"):
        read_params(tmp_path / "absent.yaml")


def test_flags_win_over_the_file() -> None:
    merged = merge_params({"deployer": {"p1": 1, "p2": 2}}, {"deployer": {"p1": 9}, "router": {}})
    assert merged == {"deployer": {"p1": 9, "p2": 2}}
