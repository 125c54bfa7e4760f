"""`HandlerSettings`: the operator handlers' environment, read once into one object.

The kopf handlers (`lmedge.operator.handlers`) take their few settings from
the environment (the chart sets them on the controller's container). They
are read in one place, validated, and a bad value is one `ConfigError` line
naming the variable, before kopf starts, instead of a `ValueError` at import
or a name found missing at the first event.

The store's location is not here: it has its own setting (`lmedge.store.location`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from lmedge.errors import ConfigError

#: A duration in seconds: positive and finite.
Seconds = Annotated[float, Field(gt=0, allow_inf_nan=False)]

__all__ = ["HandlerSettings"]


class HandlerSettings(BaseModel):
    """What the operator's handlers are configured with; each field is read from the
    environment variable that is its alias. Defaults are the chart's.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    timeslicing_namespace: str = Field(
        default="lmedge-system",
        min_length=1,
        alias="LMEDGE_TIMESLICING_NAMESPACE",
        description="Namespace of the NVIDIA device plugin's time-slicing ConfigMap.",
    )
    timeslicing_configmap: str = Field(
        default="lmedge-time-slicing",
        min_length=1,
        alias="LMEDGE_TIMESLICING_CONFIGMAP",
        description="Name of that ConfigMap, which the operator writes.",
    )
    model_images: str = Field(
        default="",
        pattern=r"^([^/]+/[^/]+)?$",
        alias="LMEDGE_MODEL_IMAGES_CONFIGMAP",
        description="`NAMESPACE/NAME` of the ConfigMap listing each LMService's image and uid, "
        "the parameter of the node agents' admission policy (the chart's "
        "`<release>-model-images`); empty: not maintained.",
    )
    model_images_namespace: str = Field(
        default="",
        alias="LMEDGE_MODEL_IMAGES_NAMESPACE",
        description="The namespace whose LMServices it lists (the workload namespace); "
        "empty: the ConfigMap's own. The chart keeps them apart, so a workload namespace "
        "deleted and made again does not take the admission parameter with it.",
    )
    status_interval_s: Seconds = Field(
        default=30.0,
        alias="LMEDGE_STATUS_INTERVAL_S",
        description="Seconds between LMService status refreshes (success ratio, latency, "
        "instances).",
    )
    status_window_s: Seconds = Field(
        default=300.0,
        alias="LMEDGE_STATUS_WINDOW_S",
        description="Window of the success ratio and latency in an LMService's status, seconds.",
    )

    @property
    def model_images_for(self) -> str:
        """The namespace whose LMServices the model-images ConfigMap lists."""
        return self.model_images_namespace or self.model_images.partition("/")[0]

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> HandlerSettings:
        """The settings in `environ` (other variables are ignored); `ConfigError` on a bad one."""
        given = {
            f.alias: environ[f.alias]
            for f in cls.model_fields.values()
            if f.alias is not None and f.alias in environ
        }
        try:
            return cls.model_validate(given)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise ConfigError(f"{where}: {first['msg']}, got {first.get('input')!r}") from exc
