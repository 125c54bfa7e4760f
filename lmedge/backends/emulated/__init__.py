"""The emulated world: `EmulatedBackend` over the SimPy engine in `lmedge.sim`."""

from lmedge.backends.emulated.backend import EmulatedBackend
from lmedge.sim import Scenario, SimClock, load_scenario

__all__ = ["EmulatedBackend", "Scenario", "SimClock", "load_scenario"]
