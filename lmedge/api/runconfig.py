"""`RunConfig`: the one configuration of a run, shared by every process of it.

On a cluster the controller builds it from its flags (the Helm chart's `loop`
and `policy` values), validates it, and stores it with the run
(`RunInfo.config`). Node agents and gateways take none of these settings as
flags: they read the run's `RunConfig` from the store (a gateway also receives
`slot_s` and `tau_s` with every routing push), so slot boundaries, epochs,
deadlines and plugin parameters cannot differ between processes.

It holds what changes a decision or a record: the loop constants and the
policy. It deliberately holds no addresses, credentials or namespaces: those
differ per process and stay flags.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field, ValidationError

from lmedge.api.base import WireModel
from lmedge.api.constants import EPOCH_SLOTS, LAMBDA, SLOT_S, TAU_S
from lmedge.errors import ConfigError

__all__ = ["DEFAULT_PROFILE", "PluginTier", "PolicyConfig", "RunConfig", "parse_run_config"]

#: The profile a run uses when none is named (the best measured one; issue 11).
DEFAULT_PROFILE = "ma"

PluginTier = Literal["planner", "router", "deployer"]


class PolicyConfig(WireModel):
    """The policy of a run: a profile, optional per-tier overrides, plugin parameters.

    `params` maps a tier to the parameters of its plugin (validated by the
    plugin when it is built; an unknown one is a `ConfigError` then). `seed`
    seeds the randomized plugins; each instance derives its own from it and
    its role, so the node agents' deployers are seeded as in the emulator.
    """

    profile: str = Field(default=DEFAULT_PROFILE, min_length=1, max_length=128)
    planner: str | None = Field(default=None, min_length=1, max_length=128)
    router: str | None = Field(default=None, min_length=1, max_length=128)
    deployer: str | None = Field(default=None, min_length=1, max_length=128)
    params: dict[PluginTier, dict[str, Any]] = Field(default_factory=dict)
    seed: int = Field(default=0, ge=0)


class RunConfig(WireModel):
    """The loop constants and the policy of one run (defaults: the paper's).

    `slot_s` seconds per slot, `epoch_slots` slots per planning epoch, `tau_s`
    the request deadline in seconds, `lam` the objective weight lambda in
    [0, 1]. Non-finite values are refused: a slot of `inf` is no slot.
    """

    slot_s: float = Field(default=SLOT_S, gt=0, allow_inf_nan=False, description="Slot, s.")
    epoch_slots: int = Field(default=EPOCH_SLOTS, ge=1, description="Slots per epoch.")
    tau_s: float = Field(default=TAU_S, gt=0, allow_inf_nan=False, description="Deadline, s.")
    lam: float = Field(default=LAMBDA, ge=0, le=1, description="Objective weight lambda.")
    policy: PolicyConfig = Field(default_factory=PolicyConfig)

    def loop_constants(self) -> dict[str, Any]:
        """`slot_s`, `epoch_slots`, `tau_s`, `lam`: the fields `ClusterContext` shares."""
        return {
            "slot_s": self.slot_s,
            "epoch_slots": self.epoch_slots,
            "tau_s": self.tau_s,
            "lam": self.lam,
        }


def parse_run_config(data: Mapping[str, Any], names: Mapping[str, str] | None = None) -> RunConfig:
    """`data` as a `RunConfig`, or its first problem as one `ConfigError` line.

    `names` maps a field to what the user typed for it (e.g. `tau_s` to
    `--tau`), so the message names the flag, not the model's field.
    """
    try:
        return RunConfig.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        path = ".".join(str(p) for p in first["loc"])
        where = (names or {}).get(path, path)
        raise ConfigError(f"{where}: {first['msg']}, got {first.get('input')!r}") from exc
