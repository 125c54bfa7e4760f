"""The paper's loop constants, defined once, and `LoopConstants`, the one value holding them.

Every default of a slot length, an epoch, the deadline tau or the objective
weight lambda in lmedge (the emulator's `LoopSpec`, the `ClusterContext`, the
controller's flags, the gateway, the `RunConfig`) is one of these names, so
changing the paper's setting in one place changes it everywhere and no two
processes can silently disagree on a default.

`LoopConstants` is the value a run carries them in: the scenario's `loop:`
section, the stored `RunConfig`, the Kubernetes backend's settings and every
`ClusterContext` contain (or, for the scenario's camelCase section, extend)
this one frozen model instead of re-spelling its four fields, so a constant
added here reaches every hop and none can be forgotten in a copy.

Values are those of the paper's evaluation (§III, §V-D, §VI). Plugin-specific
calibrations (e.g. the Lyapunov deployer's alpha table) stay with their
plugin: they are parameters of one policy, not of the loop.
"""

from __future__ import annotations

from typing import Final

from pydantic import ConfigDict, Field

from lmedge.api.base import WireModel

__all__ = [
    "COLD_START_S",
    "EPOCH_SLOTS",
    "LAMBDA",
    "RADIO_WATTS",
    "SLOT_S",
    "TAU_S",
    "LoopConstants",
]

#: Transmit/receive power while a request's payload is on the link, W (assumption:
#: a wired NIC plus switch port share; CEMA's communication energy and the
#: emulator's per-request energy both use it).
RADIO_WATTS: Final = 2.0
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


class LoopConstants(WireModel):
    """The control loop's constants: slot, epoch, deadline and objective weight.

    Frozen: a run's constants never change while it runs, and a context or a
    configuration that holds them may be shared between threads. Non-finite
    values are refused: a slot of `inf` is no slot. Defaults: the paper's.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    slot_s: float = Field(
        default=SLOT_S,
        gt=0,
        allow_inf_nan=False,
        description="Slot length, seconds: routing and deployment once a slot. Paper §V-D: 30.",
    )
    epoch_slots: int = Field(
        default=EPOCH_SLOTS,
        ge=1,
        description="Slots per planning epoch: the planner runs once an epoch. Paper §VI: 50.",
    )
    tau_s: float = Field(
        default=TAU_S,
        gt=0,
        allow_inf_nan=False,
        description="Request deadline tau, seconds (an LMService's own deadline overrides it). "
        "Paper §III: 900.",
    )
    lam: float = Field(
        default=LAMBDA,
        ge=0,
        le=1,
        allow_inf_nan=False,
        description="Objective weight lambda in [0, 1], dimensionless: latency against "
        "unfairness. Paper §III: 0.5.",
    )
