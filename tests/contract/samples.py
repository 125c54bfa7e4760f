"""Documents of every kind, built deterministically for the contract tests."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from lmedge.api.decisions import Decision, MacroPolicy, Placement, RoutingMap
from lmedge.api.observations import EpochMetrics, LMStats, MemoryCase
from lmedge.api.records import NodeTelemetry, RequestRecord
from lmedge.store import AnyDecision, RunInfo

T0 = datetime(2025, 3, 1, 12, 0, 0, 250000, tzinfo=UTC)
LMS = ("qwen", "llama", "phi")
NODES = ("a", "b", "c")


def macro(run: str, epoch: int) -> Decision[MacroPolicy]:
    value = MacroPolicy.model_validate(
        {
            "routing": [
                {"lm": lm, "weights": [{"node": "a", "p": 0.25}, {"node": "b", "p": 0.75}]}
                for lm in LMS
            ],
            # One role with the rule planner's modes, the others without (an LLM's):
            # documents with and without the field round-trip alike.
            "roles": [
                {"node": n, "lms": list(LMS[:2])}
                | ({"modes": {"qwen": "gpu", "llama": "cpu"}} if n == "a" else {})
                for n in NODES
            ],
            "rationale": f"epoch {epoch}",
        }
    )
    return Decision[MacroPolicy](
        agent="planner",
        policy="agentic-planner",
        source="llm",
        value=value,
        run=run,
        epoch=epoch,
        raw='{"routing": []}',
        tokens_in=812,
        tokens_out=96,
        model="gpt-x",
        latency_s=1.5,
        created_at=T0 + timedelta(minutes=epoch),
    )


def routing(run: str, epoch: int, slot: int) -> Decision[RoutingMap]:
    value = RoutingMap.model_validate(
        {"routes": [{"origin": o, "lm": lm, "destination": "b"} for o in NODES for lm in LMS]}
    )
    return Decision[RoutingMap](
        agent="scheduler",
        policy="lyapunov",
        source="rule",
        value=value,
        run=run,
        epoch=epoch,
        slot=slot,
        sim_time_s=30.0 * slot,
    )


def placement(run: str, epoch: int, slot: int, node: str) -> Decision[Placement]:
    value = Placement.model_validate(
        {
            "node": node,
            "lms": [
                {"lm": "qwen", "mode": "gpu", "cpu_cores": 2.0, "vgpus": 1},
                {"lm": "phi", "mode": "off", "cpu_cores": 0.0, "vgpus": 0},
            ],
        }
    )
    return Decision[Placement](
        agent="deployer",
        policy="agentic-deployer",
        source="fallback",
        value=value,
        run=run,
        epoch=epoch,
        slot=slot,
        node=node,
        parsed=False,
        validated=False,
        outcome="replaced",
        violations=["vram: 3 vGPUs > 2"],
        error="invalid JSON",
    )


def decisions(run: str, epochs: int = 2, slots: int = 3) -> list[AnyDecision]:
    """Decisions in the order a run makes them: plan, then per slot route + place."""
    out: list[AnyDecision] = []
    for e in range(epochs):
        out.append(macro(run, e))
        for s in range(e * slots, (e + 1) * slots):
            out.append(routing(run, e, s))
            out.extend(placement(run, e, s, n) for n in NODES)
    return out


def requests(run: str, n: int, *, start: int = 0) -> list[RequestRecord]:
    """`n` request records; every 4th times out, latencies vary by index."""
    out = []
    for i in range(start, start + n):
        ok = i % 4 != 3
        out.append(
            RequestRecord(
                id=f"{run}-q{i:06d}",
                run=run,
                lm=LMS[i % 3],
                origin=NODES[i % 3],
                destination=NODES[(i + 1) % 3],
                prompts=5,
                prompts_done=5 if ok else 2,
                slot=i // 10,
                submit_s=float(i) * 0.5,
                uplink_s=0.125,
                queue_s=0.01 * (i % 7),
                inference_s=1.0 + 0.5 * (i % 5),
                downlink_s=0.0625,
                outcome="success" if ok else "timeout",
                conflict=i % 9 == 0,
                mode="gpu" if ok else "cpu",
            )
        )
    return out


def telemetry(run: str, node: str, t: float) -> NodeTelemetry:
    return NodeTelemetry(
        run=run,
        node=node,
        time_s=t,
        cpu_util=0.5,
        memory_util=0.25,
        gpu_util=[0.75],
        vram_used_gib=[3.5],
        extra={"power_w": 42.0},
    )


def memory(run: str, epoch: int, objective: float | None) -> MemoryCase:
    return MemoryCase(
        run=run,
        epoch=epoch,
        traffic={"qwen": 10 * epoch},
        policy=macro(run, epoch).value,
        objective=objective,
        metrics=EpochMetrics(
            per_lm=[
                LMStats(lm="qwen", arrivals=4, successes=3, success_ratio=0.75, mean_latency_s=2.5)
            ],
            requests=4,
            successes=3,
            mean_latency_s=2.5,
            jain=0.9,
            f_norm=0.5,
            t_norm=0.25,
            objective=objective,
        ),
    )


def run_info(run: str, minutes: int = 0) -> RunInfo:
    return RunInfo(
        id=run, scenario="testbed-7", policy="MA", seed=42, started=T0 + timedelta(minutes=minutes)
    )
