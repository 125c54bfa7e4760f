"""Write charts/lmedge/dashboards/lmedge.json, the Grafana dashboard of the chart.

The dashboard reads the gateways', model servers' and control plane's
Prometheus metrics (lmedge.dataplane.metrics, lmedge.modelserver.app,
lmedge.controller.prometheus). `tests/unit/test_grafana.py` checks the file
matches this script and that every expression names an exported metric.

    python tools/make-grafana-dashboard.py [--check]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parents[1] / "charts" / "lmedge" / "dashboards" / "lmedge.json"
W = "10m"  # rate window: a few 30-s slots

# (title, unit, [(expr, legend)], description)
Panel = tuple[str, str, list[tuple[str, str]], str]

ROWS: list[tuple[str, list[Panel]]] = [
    (
        "Requests (gateways)",
        [
            (
                "Prompt sets per second by LM and outcome",
                "reqps",
                [
                    (
                        f'sum by (lm, outcome) (rate(lmedge_gateway_requests_total{{lm=~"$lm"}}[{W}]))',
                        "{{lm}} {{outcome}}",
                    )
                ],
                "Every prompt set ends with one outcome: success, timeout, rejected "
                "(admission control), node_lost or lm_removed.",
            ),
            (
                "Success ratio by LM",
                "percentunit",
                [
                    (
                        f'sum by (lm) (rate(lmedge_gateway_requests_total{{outcome="success",lm=~"$lm"}}[{W}]))'
                        f' / sum by (lm) (rate(lmedge_gateway_requests_total{{lm=~"$lm"}}[{W}]))',
                        "{{lm}}",
                    )
                ],
                "Served within the deadline tau, over all prompt sets submitted (the paper's Fig. 7).",
            ),
            (
                "End-to-end latency p50 / p95 by LM",
                "s",
                [
                    (
                        f"histogram_quantile({q}, sum by (lm, le) (rate("
                        f'lmedge_gateway_stage_seconds_bucket{{stage="total",lm=~"$lm"}}[{W}])))',
                        f"{{{{lm}}}} p{int(q * 100)}",
                    )
                    for q in (0.5, 0.95)
                ],
                "Uplink + queue + inference + downlink, measured at the origin gateway.",
            ),
            (
                "Mean stage time",
                "s",
                [
                    (
                        f'sum by (stage) (rate(lmedge_gateway_stage_seconds_sum{{stage!="total",lm=~"$lm"}}[{W}]))'
                        f' / sum by (stage) (rate(lmedge_gateway_stage_seconds_count{{stage!="total",lm=~"$lm"}}[{W}]))',
                        "{{stage}}",
                    )
                ],
                "Where the time goes: a growing queue stage means too few instances.",
            ),
            (
                "Queue depth by node and LM",
                "short",
                [
                    (
                        # `node`: the chart's ServiceMonitor labels every gateway series
                        'sum by (node, lm) (lmedge_gateway_queue_depth{lm=~"$lm"})',
                        "{{node}} {{lm}}",
                    )
                ],
                "Prompt sets waiting in each node's FIFO queue.",
            ),
            (
                "Conflict and rejection ratios",
                "percentunit",
                [
                    (
                        f"sum(rate(lmedge_gateway_conflicts_total[{W}]))"
                        f" / sum(rate(lmedge_gateway_requests_total[{W}]))",
                        "inactive-target conflicts",
                    ),
                    (
                        f'sum(rate(lmedge_gateway_requests_total{{outcome="rejected"}}[{W}]))'
                        f" / sum(rate(lmedge_gateway_requests_total[{W}]))",
                        "rejected by admission control",
                    ),
                ],
                "A conflict: a prompt set reached a node where its LM was not active.",
            ),
        ],
    ),
    (
        "Agents (controller and node agents)",
        [
            (
                "Decisions per second by agent and source",
                "ops",
                [
                    (
                        f"sum by (agent, source) (rate(lmedge_agent_decisions_total[{W}]))",
                        "{{agent}} {{source}}",
                    )
                ],
                "source: llm (the model's proposal ran), rule (a deterministic agent or the "
                "guard's choice), fallback (the agent failed; its rule decision or the last resort ran).",
            ),
            (
                "Fallback and replaced ratios by agent",
                "percentunit",
                [
                    (
                        f'sum by (agent) (rate(lmedge_agent_decisions_total{{source="fallback"}}[{W}]))'
                        f" / sum by (agent) (rate(lmedge_agent_decisions_total[{W}]))",
                        "{{agent}} fallback",
                    ),
                    (
                        f'sum by (agent) (rate(lmedge_agent_decisions_total{{outcome="replaced"}}[{W}]))'
                        f" / sum by (agent) (rate(lmedge_agent_decisions_total[{W}]))",
                        "{{agent}} replaced",
                    ),
                ],
                "A high fallback ratio means the agent LLM is failing (down, slow or invalid replies).",
            ),
            (
                "Decision latency p95 by agent",
                "s",
                [
                    (
                        f"histogram_quantile(0.95, sum by (agent, le) (rate("
                        f"lmedge_agent_decision_seconds_bucket[{W}])))",
                        "{{agent}}",
                    )
                ],
                "Must stay inside the slot: the scheduler's and each deployer's budget.",
            ),
            (
                "Slot decision time p95",
                "s",
                [
                    (
                        "histogram_quantile(0.95, sum by (le) (rate("
                        f"lmedge_controller_slot_duration_seconds_bucket[{W}])))",
                        "slot decision time p95",
                    ),
                ],
                "The controller's serial work per slot.",
            ),
            (
                "Slots since each node agent's last decision",
                "short",
                [
                    (
                        "scalar(max(lmedge_controller_slot))"
                        " - max by (node) (max_over_time(lmedge_node_agent_last_slot[1h]))",
                        "{{node}}",
                    )
                ],
                "A node agent that stops deciding keeps its last placement; see the "
                "LmedgeNodeAgentSilent alert.",
            ),
        ],
    ),
    (
        "Store and model servers",
        [
            (
                "Store buffer",
                "short",
                [
                    ("sum by (pod) (lmedge_store_pending_documents)", "{{pod}} pending"),
                    (
                        f"sum by (pod) (rate(lmedge_store_spilled_documents_total[{W}]))",
                        "{{pod}} spilled/s",
                    ),
                    (
                        f"sum by (pod) (increase(lmedge_store_dropped_documents_total[{W}]))",
                        "{{pod}} lost",
                    ),
                ],
                "Records wait in memory while the store is unreachable, then spill to disk; "
                "lost means they will never arrive.",
            ),
            (
                "Prompts per second by LM",
                "ops",
                [
                    (
                        f'sum by (lm) (rate(lmedge_model_prompts_total{{lm=~"$lm"}}[{W}]))',
                        "{{lm}}",
                    ),
                    (
                        f'sum by (lm) (rate(lmedge_model_resumed_prompts_total{{lm=~"$lm"}}[{W}]))',
                        "{{lm}} resumed",
                    ),
                ],
                "Resumed: prompts a restarted model pod found already done (not repeated).",
            ),
            (
                "Compute time per prompt p95 by LM",
                "s",
                [
                    (
                        "histogram_quantile(0.95, sum by (lm, le) (rate("
                        f'lmedge_model_prompt_seconds_bucket{{lm=~"$lm"}}[{W}])))',
                        "{{lm}}",
                    )
                ],
                "Inference time inside the model server.",
            ),
        ],
    ),
    (
        "Token engines (llama.cpp, vLLM; read by the node agents)",
        [
            (
                "KV-cache usage by node and LM",
                "percentunit",
                [
                    (
                        'max by (node, lm) (lmedge_engine_kv_cache_usage_ratio{lm=~"$lm"})',
                        "{{node}} {{lm}}",
                    )
                ],
                "Share of each engine pod's KV-cache pool in use (llamacpp:kv_cache_usage_ratio, "
                "vllm:kv_cache_usage_perc); a full cache queues new sequences.",
            ),
            (
                "Running and waiting sequences by node and LM",
                "short",
                [
                    (
                        'max by (node, lm, state) (lmedge_engine_sequences{lm=~"$lm"})',
                        "{{node}} {{lm}} {{state}}",
                    )
                ],
                "Running: in the batch (llamacpp:requests_processing, vllm:num_requests_running); "
                "waiting: queued at the engine (llamacpp:requests_deferred, vllm:num_requests_waiting).",
            ),
            (
                "Token throughput by node, LM and phase",
                "short",
                [
                    (
                        'max by (node, lm, phase) (lmedge_engine_tokens_per_second{lm=~"$lm"})',
                        "{{node}} {{lm}} {{phase}}",
                    )
                ],
                "Tokens/s over the last slot from the engines' prompt and generation token counters.",
            ),
        ],
    ),
]


def dashboard() -> dict[str, Any]:
    panels: list[dict[str, Any]] = []
    pid = 1
    y = 0
    for row_title, row in ROWS:
        panels.append(
            {"type": "row", "title": row_title, "id": pid, "collapsed": False,
             "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}, "panels": []}
        )  # fmt: skip
        pid += 1
        y += 1
        for i, (title, unit, targets, description) in enumerate(row):
            panels.append(
                {
                    "type": "timeseries",
                    "id": pid,
                    "title": title,
                    "description": description,
                    "datasource": {"type": "prometheus", "uid": "${datasource}"},
                    "gridPos": {"h": 8, "w": 12, "x": 12 * (i % 2), "y": y + 8 * (i // 2)},
                    "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
                    "options": {"legend": {"displayMode": "list", "placement": "bottom"}},
                    "targets": [
                        {
                            "refId": chr(ord("A") + j),
                            "expr": expr,
                            "legendFormat": legend,
                            "datasource": {"type": "prometheus", "uid": "${datasource}"},
                        }
                        for j, (expr, legend) in enumerate(targets)
                    ],
                }
            )
            pid += 1
        y += 8 * ((len(row) + 1) // 2)
    return {
        "title": "lmedge",
        "uid": "lmedge-overview",
        "description": "Requests, agents' decisions and the store of an lmedge control plane.",
        "tags": ["lmedge"],
        "editable": True,
        "schemaVersion": 39,
        "time": {"from": "now-3h", "to": "now"},
        "refresh": "30s",
        "templating": {
            "list": [
                {"type": "datasource", "name": "datasource", "label": "Prometheus",
                 "query": "prometheus", "current": {}},
                {"type": "query", "name": "lm", "label": "LM", "multi": True, "includeAll": True,
                 "allValue": ".*", "current": {"text": "All", "value": "$__all"},
                 "datasource": {"type": "prometheus", "uid": "${datasource}"},
                 "query": {"query": "label_values(lmedge_gateway_requests_total, lm)",
                           "refId": "lm"},
                 "refresh": 2},
            ]
        },  # fmt: skip
        "panels": panels,
    }


def render() -> str:
    return json.dumps(dashboard(), indent=2) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="Fail if the file is out of date.")
    args = ap.parse_args()
    text = render()
    if args.check:
        if not OUT.exists() or OUT.read_text() != text:
            print(f"{OUT} is out of date: run python tools/make-grafana-dashboard.py", file=sys.stderr)
            return 1
        return 0
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
