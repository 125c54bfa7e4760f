"""The edge-testbed emulator: scenarios, workloads and the discrete-event engine.

`load_scenario` reads a scenario folder (EdgeNode + LMService manifests plus
`scenario.yaml`); `Emulator` runs it in SimPy virtual time. The controller
does not use this package directly: it drives
`lmedge.backends.emulated.EmulatedBackend`, which wraps the engine behind
the `ClusterBackend` protocol.
"""

from lmedge.sim.clock import SimClock
from lmedge.sim.engine import Emulator
from lmedge.sim.scenario import Scenario, ScenarioSpec, load_scenario
from lmedge.sim.trace import RequestSpec, read_trace
from lmedge.sim.workload import Workload, record_trace

__all__ = [
    "Emulator",
    "RequestSpec",
    "Scenario",
    "ScenarioSpec",
    "SimClock",
    "Workload",
    "load_scenario",
    "read_trace",
    "record_trace",
]
