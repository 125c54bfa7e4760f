"""`RunConfig`: the one configuration of a run, shared by every process of it.

On a cluster the controller builds it from its flags (the Helm chart's `loop`
and `policy` values), validates it, and stores it with the run
(`RunInfo.config`). Node agents and gateways take none of these settings as
flags: they read the run's `RunConfig` from the store (a gateway also receives
the slot and tau with every routing push), so slot boundaries, epochs,
deadlines and plugin parameters cannot differ between processes.

It holds what changes a decision or a record: the loop constants
(`LoopConstants`) and the policy. It deliberately holds no addresses,
credentials or namespaces: those differ per process and stay flags.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field, ValidationError, model_validator

from lmedge.api.base import WireModel
from lmedge.api.constants import LoopConstants
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

    Stored as `{"loop": {...}, "policy": {...}}`, the shape of the Helm
    chart's `loop` and `policy` values. A run stored before the constants were
    one value (its four constants beside `policy`) still reads: they are taken
    as its `loop` (`_flat_constants`); a document with both is refused.
    """

    loop: LoopConstants = Field(
        default_factory=LoopConstants, description="Slot, epoch, deadline tau, lambda."
    )
    policy: PolicyConfig = Field(default_factory=PolicyConfig)

    @model_validator(mode="before")
    @classmethod
    def _flat_constants(cls, data: Any) -> Any:
        """A stored flat document (`slot_s`, ... beside `policy`) as a nested one."""
        if not isinstance(data, Mapping):
            return data
        flat = {k: data[k] for k in LoopConstants.model_fields if k in data}
        if not flat:
            return data
        if "loop" in data:
            raise ValueError(f"{', '.join(flat)}: give the loop constants in `loop` only")
        rest = {k: v for k, v in data.items() if k not in flat}
        return {**rest, "loop": flat}


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
