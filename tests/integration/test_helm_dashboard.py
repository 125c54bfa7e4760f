"""The chart's dashboard: a container of the controller pod behind a ClusterIP
Service, protected by the users' API token, rendered by the real `helm`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_helm import (
    CHART,
    SERVICES,
    _click_command,
    by_kind,
    helm,
    helm_bin,  # noqa: F401 - the fixture
    pod_specs,
    template,
)


def _dashboard(docs: list[dict[str, Any]]) -> dict[str, Any] | None:
    spec = pod_specs(docs)["t-lmedge-controller"]
    return next((c for c in spec["containers"] if c["name"] == "dashboard"), None)


@pytest.mark.parametrize(
    "values",
    [[], ["--set-file", f"lmServices={SERVICES}"]],
    ids=["no-gateway", "with-gateway"],
)
def test_the_dashboard_is_served_by_the_controller_behind_the_user_token(
    helm_bin: Path,  # noqa: F811
    values: list[str],
) -> None:
    docs = template(helm_bin, *values)
    container = _dashboard(docs)
    assert container is not None
    command, *args = container["args"]
    assert command == "dashboard"
    _click_command(command).make_context(command, list(args))  # the real CLI's options
    assert "--host=0.0.0.0" in args
    token_arg = next(a for a in args if a.startswith("--token-file="))
    token_path = token_arg.split("=", 1)[1]
    spec = pod_specs(docs)["t-lmedge-controller"]
    mount = next(m for m in container["volumeMounts"] if token_path.startswith(m["mountPath"]))
    volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
    secret = volume["secret"]["secretName"]
    # The same token the gateways' user API takes, rendered even without a gateway.
    assert "token" in by_kind(docs, "Secret")[secret]["stringData"]
    service = by_kind(docs, "Service")["t-lmedge-dashboard"]
    assert service["spec"]["type"] == "ClusterIP"
    (port,) = service["spec"]["ports"]
    assert port["targetPort"] == "dashboard"
    assert {p["name"] for p in container["ports"]} == {"dashboard"}
    deployment = by_kind(docs, "Deployment")["t-lmedge-controller"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert container["readinessProbe"]["httpGet"]["path"] == "/healthz"


def test_the_dashboard_can_be_turned_off(helm_bin: Path) -> None:  # noqa: F811
    docs = template(helm_bin, "--set", "dashboard.enabled=false")
    assert _dashboard(docs) is None
    assert "t-lmedge-dashboard" not in by_kind(docs, "Service")
    assert "t-lmedge-gateway-token" not in by_kind(docs, "Secret")  # no gateway, no dashboard


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (["--set", "dashboard.port=0"], "/dashboard/port"),
        (["--set", "dashboard.colour=blue"], "colour"),
    ],
    ids=["port-zero", "unknown-key"],
)
def test_bad_dashboard_values_are_refused(
    helm_bin: Path,  # noqa: F811
    values: list[str],
    message: str,
) -> None:
    done = helm(helm_bin, "template", "t", str(CHART), *values, check=False)
    assert done.returncode != 0
    assert message in done.stderr
