"""The operator handlers' environment: read once into `HandlerSettings`, a bad value named."""

from __future__ import annotations

import pytest

from lmedge.errors import ConfigError
from lmedge.operator.settings import HandlerSettings


def test_an_empty_environment_gives_the_charts_defaults() -> None:
    s = HandlerSettings.from_environ({"PATH": "/bin"})  # other variables are not settings

    assert (s.timeslicing_namespace, s.timeslicing_configmap) == (
        "lmedge-system",
        "lmedge-time-slicing",
    )
    assert (s.model_images, s.model_images_for) == ("", "")
    assert (s.status_interval_s, s.status_window_s) == (30.0, 300.0)


def test_every_variable_reaches_its_field() -> None:
    s = HandlerSettings.from_environ(
        {
            "LMEDGE_TIMESLICING_NAMESPACE": "gpu-operator",
            "LMEDGE_TIMESLICING_CONFIGMAP": "slicing",
            "LMEDGE_MODEL_IMAGES_CONFIGMAP": "lmedge-system/rel-model-images",
            "LMEDGE_MODEL_IMAGES_NAMESPACE": "workloads",
            "LMEDGE_STATUS_INTERVAL_S": "1",
            "LMEDGE_STATUS_WINDOW_S": "60.5",
        }
    )

    assert (s.timeslicing_namespace, s.timeslicing_configmap) == ("gpu-operator", "slicing")
    assert (s.model_images, s.model_images_for) == ("lmedge-system/rel-model-images", "workloads")
    assert (s.status_interval_s, s.status_window_s) == (1.0, 60.5)


def test_the_model_images_namespace_defaults_to_the_configmaps_own() -> None:
    s = HandlerSettings.from_environ({"LMEDGE_MODEL_IMAGES_CONFIGMAP": "rel-ns/images"})

    assert s.model_images_for == "rel-ns"


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("LMEDGE_STATUS_INTERVAL_S", "soon"),
        ("LMEDGE_STATUS_INTERVAL_S", "0"),
        ("LMEDGE_STATUS_WINDOW_S", "inf"),
        ("LMEDGE_MODEL_IMAGES_CONFIGMAP", "no-namespace"),
        ("LMEDGE_TIMESLICING_NAMESPACE", ""),
    ],
    ids=["interval-not-a-number", "interval-zero", "window-inf", "images-no-slash", "ns-empty"],
)
def test_a_bad_value_is_one_line_naming_the_variable(name: str, value: str) -> None:
    with pytest.raises(ConfigError) as err:
        HandlerSettings.from_environ({name: value})

    message = str(err.value)
    assert message.startswith(name + ":") and "\n" not in message
