"""The chart's monitoring objects, rendered by the real Helm: off by default, and
when on, the dashboard ConfigMap carries the dashboard file and the rules carry
the thresholds of the values (their expressions are checked against the exported
metrics in tests/unit/test_monitoring.py)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.integration.test_helm import CHART, by_kind, helm, helm_bin, template

__all__ = ["helm_bin"]  # the module-scoped fixture, shared with test_helm


def test_monitoring_is_off_by_default(helm_bin: Path) -> None:
    docs = template(helm_bin)
    assert not by_kind(docs, "PrometheusRule")
    assert not [n for n in by_kind(docs, "ConfigMap") if n.endswith("grafana-dashboard")]


def test_dashboard_and_rules_render_with_the_values(helm_bin: Path) -> None:
    docs = template(
        helm_bin,
        "--set", "monitoring.grafanaDashboard.enabled=true",
        "--set", "monitoring.grafanaDashboard.namespace=monitoring",
        "--set", "monitoring.prometheusRule.enabled=true",
        "--set", "monitoring.prometheusRule.fallbackRatio=0.05",
        "--set", "monitoring.prometheusRule.silentSlots=9",
        "--set", "monitoring.prometheusRule.labels.release=kps",
    )  # fmt: skip
    cm = by_kind(docs, "ConfigMap")["t-lmedge-grafana-dashboard"]
    assert cm["metadata"]["namespace"] == "monitoring"
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    shipped = json.loads((CHART / "dashboards" / "lmedge.json").read_text())
    assert json.loads(cm["data"]["lmedge.json"]) == shipped
    rule = by_kind(docs, "PrometheusRule")["t-lmedge"]
    assert rule["metadata"]["labels"]["release"] == "kps"
    rules = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}
    assert set(rules) >= {
        "LmedgeAgentFallbackRateHigh",
        "LmedgeConflictRatioHigh",
        "LmedgeTimeoutRatioHigh",
        "LmedgeNodeAgentSilent",
        "LmedgeStoreSpilling",
        "LmedgeStoreLosingRecords",
    }
    assert rules["LmedgeAgentFallbackRateHigh"]["expr"].rstrip().endswith("> 0.05")
    assert rules["LmedgeNodeAgentSilent"]["expr"].rstrip().endswith("> 9")
    assert all("{{ $" not in r["expr"] for r in rules.values())


def test_bad_thresholds_are_refused_by_the_schema(helm_bin: Path) -> None:
    for bad in ("monitoring.prometheusRule.fallbackRatio=2", "monitoring.prometheusRule.for=soon"):
        done = helm(helm_bin, "template", "t", str(CHART), "--set", bad, check=False)
        assert done.returncode != 0
        assert "values don't meet the specifications of the schema" in done.stderr


def test_control_plane_metrics_ports_monitors_and_network_policy(helm_bin: Path) -> None:
    docs = template(helm_bin, "--set", "monitoring.podMonitor.enabled=true")
    for kind, name, container in (
        ("Deployment", "t-lmedge-controller", "controller"),
        ("DaemonSet", "t-lmedge-node-agent", "node-agent"),
    ):
        spec = by_kind(docs, kind)[name]["spec"]["template"]["spec"]
        c = next(c for c in spec["containers"] if c["name"] == container)
        assert "--metrics-port=9464" in c["args"]
        assert {"name": "metrics", "containerPort": 9464, "protocol": "TCP"} in c["ports"]
    monitors = by_kind(docs, "PodMonitor")
    assert set(monitors) == {"t-lmedge-controller", "t-lmedge-node-agent"}
    policies = by_kind(docs, "NetworkPolicy")
    for name in ("t-lmedge-controller", "t-lmedge-node-agent"):
        ports = [p["port"] for rule in policies[name]["spec"]["ingress"] for p in rule["ports"]]
        assert "metrics" in ports
    # 0 turns the metrics off: no flag, no port, no monitor.
    off = template(helm_bin, "--set", "monitoring.podMonitor.enabled=true",
                   "--set", "monitoring.metricsPort=0")  # fmt: skip
    assert not by_kind(off, "PodMonitor")
    spec = by_kind(off, "Deployment")["t-lmedge-controller"]["spec"]["template"]["spec"]
    assert not [a for c in spec["containers"] for a in c["args"] if "metrics-port" in a]
