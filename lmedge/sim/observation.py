"""What the emulated cluster reports: node snapshots, telemetry and request records.

Pure: each function reads the engine's entities at a given virtual time and
builds the `lmedge.api` objects a real cluster's nodes and gateways would
report. Nodes that are down are left out by the caller; deciding what a
request's outcome is stays with the engine.
"""

from __future__ import annotations

from collections.abc import Iterable

from lmedge.api.base import built
from lmedge.api.constants import RADIO_WATTS
from lmedge.api.engine_telemetry import EngineTelemetry
from lmedge.api.engines import GIB
from lmedge.api.observations import InstanceState, NodeState, Snapshot
from lmedge.api.records import NOT_STREAMED, NodeTelemetry, RequestOutcome, RequestRecord
from lmedge.sim.entities import Job, NodeSim
from lmedge.sim.trace import RequestSpec


def snapshot(nodes: Iterable[NodeSim], lms: Iterable[str], slot: int, now: float) -> Snapshot:
    """The slot's `Snapshot` of `nodes`, with a backlog entry for each of `lms` (those in force)."""
    lms = list(lms)
    states = [node_state(n, now, lms) for n in nodes]
    return built(Snapshot, {"slot": slot, "time_s": now, "nodes": states})


def node_state(node: NodeSim, now: float, lms: list[str]) -> NodeState:
    cpu, gpus = node.window("snapshot", now)
    spec = node.spec
    waiting = node.waiting
    return built(
        NodeState,
        {
            "name": node.name,
            "backlog": {lm: waiting[lm] for lm in lms},
            "instances": [
                built(
                    InstanceState,
                    {
                        "lm": i.lm,
                        "mode": i.mode,
                        "cpu_cores": i.cores,
                        "vgpus": i.vgpus,
                        "status": "ready" if i.ready else "pending",
                    },
                )
                for i in node.instances.values()
            ],
            "free_cpu_cores": max(0.0, spec.cpu_cores - node.cores_used),
            "free_memory_gib": max(0.0, spec.memory_gib - node.memory_used),
            "free_vgpus": max(0, spec.total_vgpus - sum(node.slots_used)),
            "free_vram_gib": max(0.0, spec.total_vram_gib - node.vram_used),
            "gpu_util": _clip(sum(gpus) / len(gpus)) if gpus else 0.0,
            "cpu_util": _clip(cpu / spec.cpu_cores),
            "engines": engine_telemetry(node),
        },
    )


def telemetry(nodes: Iterable[NodeSim], now: float) -> list[NodeTelemetry]:
    """One `NodeTelemetry` per node: utilization since the last telemetry read."""
    out: list[NodeTelemetry] = []
    for node in nodes:
        cpu, gpus = node.window("telemetry", now)
        spec = node.spec
        vram = [0.0] * len(spec.gpus)
        for i in node.instances.values():
            for g, s in i.binding:
                vram[g] += i.vram * s / max(i.vgpus, 1)
        out.append(
            NodeTelemetry(
                node=node.name,
                time_s=now,
                cpu_util=_clip(cpu / spec.cpu_cores),
                memory_util=_clip(node.memory_used / spec.memory_gib),
                gpu_util=[_clip(g) for g in gpus],
                vram_used_gib=vram,
                source="emulator",
                extra={
                    "backlog_prompts": float(sum(node.backlog(lm) for lm in node.queues)),
                    "instances": float(len(node.instances)),
                    **memory_time(node, now),
                },
                engines=engine_telemetry(node),
            )
        )
    return out


def engine_telemetry(node: NodeSim) -> list[EngineTelemetry] | None:
    """The node's token-engine pods as the node agent reads real engines (None when it runs none).

    KV usage is the tokens written over the pod's pool, running and waiting its
    engine's batch and queue: the fields a llama.cpp or vLLM pod's metrics give
    (`lmedge.nodeagent.engines`), so an agent sees the same observation in both
    worlds. Token rates are None: the emulator keeps no engine counters.
    """
    engines = [
        built(
            EngineTelemetry,
            {
                "lm": i.lm,
                "pod": "",
                "kv_cache_usage": _clip(i.engine.kv_used_tokens / i.engine.kv_capacity_tokens),
                "running": i.engine.running,
                "waiting": len(i.engine.waiting),
                "prompt_tokens_per_s": None,
                "generation_tokens_per_s": None,
            },
        )
        for i in node.instances.values()
        if i.engine is not None
    ]
    return engines or None


def memory_time(node: NodeSim, now: float) -> dict[str, float]:
    """`kv_gib_s`: the node's KV memory-time so far (GiB-seconds, stopped pods included)."""
    if node.kv_byte_s_done == 0.0 and not any(i.engine for i in node.instances.values()):
        return {}
    return {"kv_gib_s": node.kv_byte_s(now) / GIB}


def job_record(job: Job, outcome: RequestOutcome, watts: float = 0.0) -> RequestRecord:
    """The record of a request that reached the cluster, ended with `outcome`.

    `watts`: the busy power its node draws in the mode it ran in (board power
    x utilization); its energy is that over its board-seconds plus its time
    on the links (not the wait for its routing window) at `RADIO_WATTS`. A
    pipeline LM's pod serves one request at a time, so its board-seconds are
    its inference seconds; a token engine serves many at once, so a request's
    are its share of each step (`Job.board_s`): charging each the board over
    its whole inference would count a batch of n requests n times.
    """
    on_links = job.uplink_s - job.route_wait_s + job.downlink_s
    board_s = job.infer_s if job.lengths is None else job.board_s
    return built(
        RequestRecord,
        {
            "id": job.id,
            "run": "",
            "lm": job.cls,
            "model": None if job.lm == job.cls else job.lm,
            "origin": job.origin,
            "destination": job.dest,
            "prompts": job.prompts,
            "prompts_done": job.done,
            "slot": job.slot,
            "submit_s": job.submit,
            "uplink_s": job.uplink_s,
            "queue_s": job.queue_s,
            "inference_s": job.infer_s,
            "downlink_s": job.downlink_s,
            "outcome": outcome,
            "conflict": job.conflict,
            "mode": job.mode,
            "error": None,
            **(NOT_STREAMED if job.lengths is None else _token_fields(job, outcome)),
            "energy_j": board_s * watts + max(0.0, on_links) * RADIO_WATTS,
        },
    )


def _token_fields(job: Job, outcome: RequestOutcome) -> dict[str, float | int | None]:
    """A token-engine request's token-level fields: its tokens always; its times when served.

    TTFT: submit to the first token of its first sequence at the origin; TPOT:
    the mean over its sequences' output tokens after their first (sum of
    last - first token over sum of output - 1); prefill + decode = inference.
    """
    served = outcome == "success"
    return {
        "ttft_s": job.ttft_s if served else None,
        "tpot_s": (job.tpot_num / job.tpot_den if job.tpot_den else 0.0) if served else None,
        "input_tokens": job.tok_in,
        "output_tokens": job.tok_out,
        "prefill_s": job.prefill_s if served else None,
        "decode_s": job.decode_s if served else None,
    }


def refusal_record(rid: str, r: RequestSpec, at: float, outcome: RequestOutcome) -> RequestRecord:
    """The record of a request ended at once at its origin, unserved (latency 0)."""
    return built(
        RequestRecord,
        {
            "id": rid,
            "run": "",
            "lm": r.lm,
            "model": None,
            "origin": r.origin,
            "destination": r.origin,
            "prompts": r.prompts,
            "prompts_done": 0,
            "slot": r.slot,
            "submit_s": at,
            "uplink_s": 0.0,
            "queue_s": 0.0,
            "inference_s": 0.0,
            "downlink_s": 0.0,
            "outcome": outcome,
            "conflict": False,
            "mode": "none",
            "error": None,
            **NOT_STREAMED,
            "energy_j": 0.0,
        },
    )


def _clip(x: float) -> float:
    return 0.0 if x < 0 else 1.0 if x > 1 else x
