"""The chart's Grafana dashboard and alert rules name only metrics lmedge exports.

Every `lmedge_*` series an expression selects must be one a gateway, a model
server or a control-plane process really exposes (counters as `_total`,
histograms as `_bucket`/`_sum`/`_count`), and every label it matches on must
be one those series carry or one the scrape adds (`node`, `pod`, `instance`).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry

from lmedge.api.decisions import Decision, RoutingMap
from lmedge.api.engine_telemetry import EngineTelemetry
from lmedge.api.records import RequestRecord
from lmedge.controller.prometheus import FAMILIES, ControlPlaneMetrics
from lmedge.dataplane.metrics import GatewayMetrics
from lmedge.modelserver.app import _metrics
from lmedge.store.buffer import BufferStats

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "lmedge"
#: Labels the scrape adds to every series (ServiceMonitor relabelling, target labels).
TARGET_LABELS = {"node", "pod", "instance", "job", "namespace"}
SELECTOR = re.compile(r"\b(lmedge_[a-z0-9_]+)(\{[^}]*\})?")
MATCHER = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)")
BY = re.compile(r"\b(?:by|on|without|group_left|group_right)\s*\(([^)]*)\)")


def _exported() -> dict[str, set[str]]:
    """{sample name: label names} of every series lmedge's processes export."""
    gateway = GatewayMetrics("worker-1")
    gateway.observe(
        RequestRecord(id="r1", lm="lm1", origin="worker-1", destination="worker-2", prompts=1,
                      slot=0, submit_s=0.0, uplink_s=0.1, queue_s=0.2, inference_s=0.3,
                      outcome="success", conflict=True)
    )  # fmt: skip
    gateway.set_depth("lm1", 3)
    model = _metrics("lm1")
    model.prompts.labels(lm="lm1").inc()
    model.prompt_seconds.labels(lm="lm1").observe(0.1)
    model.sets.labels(lm="lm1", outcome="success").inc()
    model.resumed.labels(lm="lm1").inc()
    control = ControlPlaneMetrics(store_stats=lambda: BufferStats(1, 2, 0, dropped=1))
    control.observe_decisions(
        [Decision[RoutingMap](agent="deployer", policy="p", source="fallback", node="worker-1",
                              value=RoutingMap(routes=[]), outcome="replaced", slot=7)]
    )  # fmt: skip
    control.observe_slot(7, 0.2)
    control.observe_engines(
        "worker-1",
        [EngineTelemetry(lm="lm1", kv_cache_usage=0.5, running=2, waiting=1,
                         prompt_tokens_per_s=10.0, generation_tokens_per_s=20.0)],
    )  # fmt: skip
    out: dict[str, set[str]] = {}
    registries: list[CollectorRegistry] = [gateway.registry, model.registry, control.registry]
    for registry in registries:
        for family in registry.collect():
            for sample in family.samples:
                out.setdefault(sample.name, set()).update(sample.labels)
    return out


def _dashboard_exprs() -> list[str]:
    dash = json.loads((CHART / "dashboards" / "lmedge.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    exprs += [v["query"]["query"] for v in dash["templating"]["list"] if v["type"] == "query"]
    return exprs


def _rule_exprs() -> list[str]:
    text = (CHART / "templates" / "prometheusrule.yaml").read_text()
    # Helm directives out: the thresholds become numbers, the rest YAML.
    text = re.sub(r"(?m)^\s*\{\{-[^}]*\}\}\s*$", "", text)
    text = re.sub(r"\{\{`(.*?)`\}\}", "x", text)
    text = re.sub(r"\{\{[^}]*\}\}", "1", text)
    doc = yaml.safe_load(text)
    return [r["expr"] for g in doc["spec"]["groups"] for r in g["rules"]]


def _problems(expr: str, exported: dict[str, set[str]]) -> list[str]:
    problems = []
    names = SELECTOR.findall(expr)
    assert names, f"no lmedge metric in {expr!r}"
    grouped = {label.strip() for g in BY.findall(expr) for label in g.split(",") if label.strip()}
    for name, matchers in names:
        if name not in exported:
            problems.append(f"{name} is not exported")
            continue
        labels = exported[name] | TARGET_LABELS
        for label in MATCHER.findall(matchers or ""):
            if label[0] not in labels:
                problems.append(f"{name} has no label {label[0]!r}")
    known = set().union(*(exported.get(n, set()) for n, _ in names)) | TARGET_LABELS | {"le"}
    problems += [f"grouping by unknown label {label!r}" for label in grouped - known]
    return problems


@pytest.mark.parametrize("source", ["dashboard", "alerts"])
def test_every_expression_names_exported_metrics_and_labels(source: str) -> None:
    exported = _exported()
    exprs = _dashboard_exprs() if source == "dashboard" else _rule_exprs()
    assert len(exprs) >= (15 if source == "dashboard" else 7)
    problems = {e: p for e in exprs if (p := _problems(e, exported))}
    assert problems == {}


def test_the_check_notices_an_unexported_metric_and_label() -> None:
    exported = _exported()
    assert _problems("rate(lmedge_gateway_request_total[5m])", exported) == [
        "lmedge_gateway_request_total is not exported"
    ]
    assert _problems('lmedge_gateway_queue_depth{stage="x"}', exported) == [
        "lmedge_gateway_queue_depth has no label 'stage'"
    ]


def test_counters_end_in_total_and_durations_in_seconds() -> None:
    # Prometheus naming: a counter's samples end in _total; a histogram of
    # durations is named with its unit.
    for name in _exported():
        if name.endswith("_created"):
            continue
        assert not name.endswith("_count") or name.removesuffix("_count").endswith("_seconds")
    assert {f.name for f in ControlPlaneMetrics().registry.collect()} >= set(FAMILIES) - {
        "lmedge_store_pending_documents",
        "lmedge_store_spilled_documents",
        "lmedge_store_dropped_documents",
    }


def test_dashboard_file_matches_its_generator() -> None:
    proc = subprocess.run(
        [sys.executable, str(REPO / "tools" / "make-grafana-dashboard.py"), "--check"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr


def test_a_run_counts_every_decision_and_slot_it_makes() -> None:
    from lmedge.bench.runner import emulated_backend, resolve_scenario
    from lmedge.controller.assembly import PolicyChoice, build_plugins
    from lmedge.controller.loop import ControlLoop
    from lmedge.sim import load_scenario

    sc = load_scenario(resolve_scenario("testbed"))
    backend = emulated_backend(sc, 1)
    plugins = build_plugins(PolicyChoice("ma"), backend.context(), 1)
    metrics = ControlPlaneMetrics()
    loop = ControlLoop(backend, plugins, run_id="m", seed=1, telemetry=False, metrics=metrics)
    result = loop.run(4)
    loop.close()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in metrics.registry.collect()
        for s in f.samples
    }
    counted = sum(v for (n, _), v in samples.items() if n == "lmedge_agent_decisions_total")
    assert counted == len(result.decisions)
    assert samples[("lmedge_controller_slot", ())] == 3
    assert samples[("lmedge_controller_slot_duration_seconds_count", ())] == 4
    deployers = {d.node for d in result.decisions if d.agent == "deployer"}
    last = {
        dict(k)["node"]: v for (n, k), v in samples.items() if n == "lmedge_node_agent_last_slot"
    }
    assert last == dict.fromkeys(deployers, 3)


def test_a_taken_metrics_port_is_one_clear_error() -> None:
    import socket

    from lmedge.errors import ConfigError

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        with pytest.raises(ConfigError, match=rf"--metrics-port {port}: "):
            ControlPlaneMetrics().serve(port, addr="127.0.0.1")


def test_engine_series_follow_the_latest_reading_of_each_node() -> None:
    control = ControlPlaneMetrics()
    engine = EngineTelemetry(lm="lm1", kv_cache_usage=0.5, running=2, waiting=1)
    control.observe_engines("worker-1", [engine])
    control.observe_engines("worker-2", [engine.model_copy(update={"kv_cache_usage": None})])
    text = control.render().decode()
    assert 'lmedge_engine_kv_cache_usage_ratio{lm="lm1",node="worker-1"} 0.5' in text
    assert 'lmedge_engine_kv_cache_usage_ratio{lm="lm1",node="worker-2"}' not in text
    assert 'lmedge_engine_sequences{lm="lm1",node="worker-2",state="waiting"} 1.0' in text
    control.observe_engines("worker-1", None)
    text = control.render().decode()
    assert 'node="worker-1"' not in text and 'node="worker-2"' in text
