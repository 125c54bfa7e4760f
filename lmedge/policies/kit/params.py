"""Parameter validation shared by the lmedge.policies plugins this package family owns.

A plugin receives its parameters as a plain mapping (from a profile, a CLI
flag or a test). `parse_params` turns that into the plugin's pydantic model
and turns every validation problem into one `ConfigError` line naming the
plugin and the field, so a typo in a profile fails when it is loaded instead
of silently falling back to a default (docs/design.md "Conventions").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from lmedge.errors import ConfigError

M = TypeVar("M", bound=BaseModel)


class PluginParams(BaseModel):
    """Base of plugin parameter models: unknown keys rejected, values validated."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def parse_params(model: type[M], params: Mapping[str, Any], plugin: str) -> M:
    """Validate `params` into `model`; raise `ConfigError` listing every bad field."""
    try:
        return model.model_validate(dict(params))
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '(params)'}: {err['msg']}"
            for err in exc.errors()
        )
        raise ConfigError(f"invalid parameters for {plugin}: {problems}") from exc
