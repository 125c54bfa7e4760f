"""A grid of runs on a Ray cluster: `RayRunExecutor`.

`lmedge bench` and `lmedge reproduce` take `--executor ray --address HOST:PORT`
(or `ray://HOST:10001` for Ray Client, `auto` for the cluster this machine
belongs to). Each run becomes one Ray task calling `lmedge.bench.runner.execute`
on its `RunSpec` (after the `setup` that fills the worker's plugin catalog),
exactly what a local pool worker calls, so the results are
the same `RunData` (same seeds, same summaries, same JSON) whatever executes
them; they come back in spec order.

What this module deliberately does not do: ship code or scenarios. The Ray
workers must have the same lmedge installed (the project's image, or the same
venv on a local cluster) and see the scenario folders at the same paths
(bundled examples resolve inside the installed package). Ray is an optional
extra (`pip install 'lmedge[ray]'`); without it `--executor ray` is a one-line
`ConfigError`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from lmedge.bench.runner import OnDone, RunData, RunSpec, Setup, execute
from lmedge.errors import ConfigError

#: CPUs one run asks Ray for: a run is one single-threaded Python process.
RUN_CPUS = 1.0


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ConfigError("--executor ray needs the ray extra: pip install 'lmedge[ray]'") from None
    return ray


class RayRunExecutor:
    """Runs as Ray tasks on the cluster at `address` (one CPU each).

    `address` is what `ray.init` takes: `HOST:PORT` of a head's GCS, a
    `ray://` client URL, or `auto`. The connection is made per `map` and
    closed after it, unless this process was already connected (then it is
    left as found). The first failing run cancels the rest and its error is
    raised here, as with the local pool. Each task runs `setup` (picklable,
    idempotent: a Ray worker process may run many tasks) before its run.
    """

    def __init__(self, address: str, setup: Setup | None = None) -> None:
        if not address.strip():
            raise ConfigError("--address must name a Ray cluster (HOST:PORT, ray://..., auto)")
        self.address = address.strip()
        self.setup = setup

    def map(self, specs: Sequence[RunSpec], on_done: OnDone | None = None) -> list[RunData]:
        if not specs:
            return []
        ray = _ray()
        owned = not ray.is_initialized()
        if owned:
            try:
                ray.init(
                    address=self.address,
                    include_dashboard=False,
                    logging_level=logging.WARNING,
                    log_to_driver=False,
                    configure_logging=False,
                )
            except (ConnectionError, ValueError, RuntimeError) as exc:
                raise ConfigError(
                    f"--address {self.address}: cannot connect to a Ray cluster: "
                    f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
                ) from exc
        try:
            task = ray.remote(num_cpus=RUN_CPUS, max_retries=0)(_execute_after)
            pending = {task.remote(self.setup, spec): i for i, spec in enumerate(specs)}
            results: dict[int, RunData] = {}
            try:
                while pending:
                    done, _ = ray.wait(list(pending), num_returns=1)
                    for ref in done:
                        i = pending.pop(ref)
                        results[i] = _unwrap(ray, ref)
                        if on_done:
                            on_done(i, results[i])
            except BaseException:
                for ref in pending:
                    ray.cancel(ref, force=True)
                raise
            return [results[i] for i in range(len(specs))]
        finally:
            if owned:
                ray.shutdown()


def _execute_after(setup: Setup | None, spec: RunSpec) -> RunData:
    """One Ray task: the worker's `setup`, then the run (`execute`)."""
    if setup is not None:
        setup()
    return execute(spec)


def _unwrap(ray: Any, ref: Any) -> RunData:
    """The task's result; a run's own error is re-raised as itself, not as Ray's wrapper."""
    try:
        data: RunData = ray.get(ref)
    except ray.exceptions.RayTaskError as exc:
        cause = getattr(exc, "cause", None)
        if isinstance(cause, ConfigError):  # a user mistake stays a one-line error
            raise cause from exc
        raise
    return data
