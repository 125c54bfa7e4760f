"""The paper's loop constants, defined once.

Every default of a slot length, an epoch, the deadline tau or the objective
weight lambda in lmedge (the emulator's `LoopSpec`, the `ClusterContext`, the
controller's flags, the gateway, the `RunConfig`) is one of these names, so
changing the paper's setting in one place changes it everywhere and no two
processes can silently disagree on a default.

Values are those of the paper's evaluation (§III, §V-D, §VI). Plugin-specific
calibrations (e.g. the Lyapunov deployer's alpha table) stay with their
plugin: they are parameters of one policy, not of the loop.
"""

from __future__ import annotations

from typing import Final

__all__ = ["COLD_START_S", "EPOCH_SLOTS", "LAMBDA", "SLOT_S", "TAU_S"]

#: Slot length, seconds (paper §V-D: routing and deployment every 30 s).
SLOT_S: Final = 30.0
#: Slots per planning epoch (paper §VI: the planner runs every 50 slots).
EPOCH_SLOTS: Final = 50
#: Request deadline tau, seconds (paper §III: 900 s = 15 min).
TAU_S: Final = 900.0
#: Objective weight lambda between latency and unfairness, in [0, 1] (paper §III: 0.5).
LAMBDA: Final = 0.5
#: Expected pod start + model load, seconds (paper §V-D: median 9.34 s measured).
#: What the agents' rules and the model-based routers charge a node that must
#: start an LM before serving it; the emulator draws its own cold starts.
COLD_START_S: Final = 9.34
