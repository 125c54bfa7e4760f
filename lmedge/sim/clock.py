"""Virtual time for the emulator: the `Clock` the controller loop is given."""

from __future__ import annotations

import simpy


class SimClock:
    """SimPy virtual time. `sleep_until(t)` runs the emulation's events up to `t`.

    Events scheduled exactly at `t` run on the next call, after the controller
    has acted at `t` (SimPy stops before normal-priority events at `until`):
    a request arriving at a slot boundary therefore follows the routing map
    published for that slot.
    """

    def __init__(self, env: simpy.Environment) -> None:
        self._env = env

    def now(self) -> float:
        return float(self._env.now)

    def sleep_until(self, t: float) -> None:
        if t > self._env.now:
            self._env.run(until=t)
