"""The grid on a real local Ray head gives exactly the local run's results."""

from __future__ import annotations

import json

import pytest

from lmedge.bench.executors import executor_for
from lmedge.bench.runner import (
    RunData,
    RunSpec,
    SequentialExecutor,
    resolve_scenario,
)
from lmedge.controller.assembly import PolicyChoice
from lmedge.errors import ConfigError
from lmedge.processes.plugins import register_plugins
from tests.fixtures.ray_head import ray_head  # noqa: F401  (the fixture)


def _grid() -> list[RunSpec]:
    testbed = resolve_scenario("testbed")
    return [RunSpec(testbed, PolicyChoice(p), seed, 6) for p in ("rr", "ll") for seed in (1, 2)]


def _canonical(runs: list[RunData]) -> list[str]:
    return [
        json.dumps({"summary": r.summary, "requests": r.requests.__dict__}, sort_keys=True)
        for r in runs
    ]


def test_ray_grid_matches_the_local_run(ray_head: str) -> None:  # noqa: F811
    specs = _grid()
    done: list[int] = []
    remote = executor_for(None, "ray", ray_head, setup=register_plugins).map(
        specs, lambda i, _: done.append(i)
    )
    local = SequentialExecutor().map(specs)
    assert sorted(done) == list(range(len(specs)))
    assert [r.spec for r in remote] == specs  # spec order, whatever finished first
    assert _canonical(remote) == _canonical(local)
    assert all(r.summary["requests"] > 0 for r in remote)  # the runs did something


def test_ray_run_error_is_the_runs_own(ray_head: str) -> None:  # noqa: F811
    bad = RunSpec(resolve_scenario("testbed"), PolicyChoice("rr"), 1, 0)  # --slots 0
    with pytest.raises(ConfigError, match="--slots must be at least 1"):
        executor_for(None, "ray", ray_head, setup=register_plugins).map([bad])


@pytest.mark.parametrize(
    ("workers", "executor", "address", "message"),
    [
        (None, "dask", None, "--executor must be one of local, ray"),
        (None, "ray", None, "--executor ray needs --address"),
        (2, "ray", "127.0.0.1:1", "--workers applies to --executor local"),
        (None, "local", "127.0.0.1:1", "--address applies to --executor ray"),
    ],
    ids=["unknown", "no-address", "workers-with-ray", "address-with-local"],
)
def test_executor_flags_are_checked(
    workers: int | None, executor: str, address: str | None, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        executor_for(workers, executor, address)
