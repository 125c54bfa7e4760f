"""Where a grid of runs executes, from the CLI's `--workers`, `--executor`, `--address`.

The executors themselves live beside what they run: `SequentialExecutor` and
`ProcessPoolRunExecutor` in `lmedge.bench.runner`, `RayRunExecutor` in
`lmedge.bench.distributed` (which imports the runner); this module only picks
one, so neither of those imports the other's module.
"""

from __future__ import annotations

import os

from lmedge.bench.runner import (
    ProcessPoolRunExecutor,
    RunExecutor,
    SequentialExecutor,
    Setup,
)
from lmedge.errors import ConfigError

__all__ = ["EXECUTORS", "executor_for"]

#: `--executor` values: `local` (this machine's cores) or `ray` (a cluster at `--address`).
EXECUTORS = ("local", "ray")


def executor_for(
    workers: int | None,
    executor: str = "local",
    address: str | None = None,
    setup: Setup | None = None,
) -> RunExecutor:
    """The executor for the CLI's flags.

    `local`: this process for `workers == 1`, else a pool of `workers`
    processes (default: one per CPU core). `ray`: tasks on the Ray cluster at
    `address` (lmedge.bench.distributed), which sizes itself; `workers` does
    not apply there. `setup` runs once in each fresh worker process (a pool
    worker, a Ray task) before its run: what fills the plugin catalog there
    (`lmedge.processes.plugins.register_plugins`); this process's own is the
    caller's to fill.
    """
    if executor not in EXECUTORS:
        raise ConfigError(f"--executor must be one of {', '.join(EXECUTORS)}, got {executor!r}")
    if executor == "ray":
        if address is None:
            raise ConfigError("--executor ray needs --address (HOST:PORT, ray://..., auto)")
        if workers is not None:
            raise ConfigError("--workers applies to --executor local; Ray sizes itself")
        from lmedge.bench.distributed import RayRunExecutor  # ray: only when asked for

        return RayRunExecutor(address, setup)
    if address is not None:
        raise ConfigError("--address applies to --executor ray")
    count = (os.cpu_count() or 1) if workers is None else workers
    if count < 1:
        raise ConfigError(f"--workers must be at least 1, got {count}")
    return SequentialExecutor() if count == 1 else ProcessPoolRunExecutor(count, setup)
