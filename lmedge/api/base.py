"""Model base classes shared by every contract.

Resource specs (what users `kubectl apply`) are camelCase on the wire, as
Kubernetes expects; decisions and records (what agents emit and the store keeps)
use snake_case field names, which LLMs and mongosh users read more easily.
Both reject unknown fields: a typo in a manifest or an LLM reply is an error
with a path, never silently ignored.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints
from pydantic.alias_generators import to_camel

#: A Kubernetes object name (RFC 1123 label), as used for nodes and LM services.
K8sName = Annotated[
    str,
    StringConstraints(min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"),
]

NonNegFloat = Annotated[float, Field(ge=0)]
PosFloat = Annotated[float, Field(gt=0)]


class SpecModel(BaseModel):
    """Base of CR specs: camelCase aliases, unknown fields rejected."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        validate_default=True,
    )


class WireModel(BaseModel):
    """Base of decisions, observations and records: snake_case, unknown fields rejected."""

    model_config = ConfigDict(extra="forbid")
