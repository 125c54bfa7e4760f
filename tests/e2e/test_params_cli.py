"""`lmedge calibrate --params` writes what `simulate` and `bench` read back with `--params`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.e2e.cli import cli

pytestmark = pytest.mark.slow


def _simulate(capsys: pytest.CaptureFixture[str], *extra: str) -> str:
    code, out, err = cli(
        ["simulate", "-p", "al", "--slots", "6", "--no-store", "--json", *extra], capsys
    )
    assert code == 0, err
    return out


def test_calibrated_parameters_round_trip_into_runs(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    params = tmp_path / "lyapunov.yaml"
    code, out, err = cli(
        ["calibrate", "--rate-slots", "6", "--window-slots", "3", "--params", str(params)],
        capsys,
    )
    assert code == 0, err
    assert f"wrote {params}" in out.replace("\n", "")
    written = yaml.safe_load(params.read_text())
    assert written["plugins"] == {"deployer": "lyapunov"}
    assert set(written["deployer"]["alpha_gpu"]) == {"lm1", "lm2", "lm3", "lm4"}

    # The same parameters as JSON (JSON is YAML too) give the same run, and
    # both differ from the paper's defaults: the file is what the run used.
    as_json = tmp_path / "lyapunov.json"
    as_json.write_text(json.dumps({"deployer": written["deployer"]}))
    with_file = _simulate(capsys, "--params", str(params))
    assert _simulate(capsys, "--params", str(as_json)) == with_file
    assert _simulate(capsys) != with_file

    # bench applies them to the profiles using the lyapunov deployer only.
    code, out, err = cli(
        ["bench", "--policies", "al,rr", "--slots", "4", "--params", str(params),
         "--out", str(tmp_path / "bench")],
        capsys,
    )  # fmt: skip
    assert code == 0, err


def test_parameters_for_another_plugin_are_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    params = tmp_path / "p.yaml"
    params.write_text("plugins: {deployer: lyapunov}\ndeployer: {p1: 1}\n")
    code, _, err = cli(["simulate", "-p", "rr", "--params", str(params), "--no-store"], capsys)
    assert code == 2
    assert err.strip().splitlines() == [
        f"error: --params {params}: deployer parameters are for 'lyapunov', not 'random'"
    ]
