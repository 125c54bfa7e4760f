"""The emulated cluster's entities: nodes, model pods and requests in flight.

Plain state, no behaviour of the engine: a `NodeSim` holds its per-LM FIFO
queues of prompt sets (`Job`), at most one pod (`Instance`) per LM, its GPU
slot occupancy and its utilization integrals; a `Job` is one request (a set
of K prompts for one LM) and the stage it is in. What moves them (arrivals,
service, deadlines) is `engine.py`; how fast a pod serves is `contention.py`.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Literal

from lmedge.api.observations import NodeInfo
from lmedge.sim.tokens.batching import BatchingEngine, TokenRequest
from lmedge.sim.trace import RequestSpec

# the stage a request (`Job.state`) is in
UPLINK, QUEUED, SERVING, DOWNLINK, DONE = range(5)
Mode = Literal["gpu", "cpu"]


class Job:
    """One request in flight: a set of K prompts for one LM.

    For a token-engine LM each prompt is one sequence (`lengths`: its input
    and output tokens); `seqs` are those in the pod's engine now, and
    `first_s`, `prefill_s`, `decode_s` what the token-level record reports;
    `board_s` the board-seconds its sequences were charged (their share of
    each engine step, `BatchingEngine.board_clock`), what its energy counts.
    """

    __slots__ = (
        "board_s",
        "cls",
        "conflict",
        "deadline",
        "decode_s",
        "dest",
        "done",
        "down_since",
        "downlink_s",
        "first_s",
        "id",
        "infer_s",
        "inst",
        "lengths",
        "lm",
        "mode",
        "origin",
        "prefill_s",
        "prompts",
        "queue_s",
        "route_wait_s",
        "seqs",
        "serve_since",
        "slot",
        "state",
        "submit",
        "tok_in",
        "tok_out",
        "tpot_den",
        "tpot_num",
        "ttft_s",
        "uplink_s",
        "wait_since",
        "wireless",
    )

    def __init__(
        self, rid: str, r: RequestSpec, dest: str, model: str, submit: float, deadline: float
    ) -> None:
        self.id = rid
        self.slot = r.slot
        self.origin = r.origin
        self.cls = r.lm  # the request class the workload generated
        self.lm = model  # the LM that serves it: its queue, pod and profile
        self.prompts = r.prompts
        self.dest = dest
        self.submit = submit
        self.deadline = deadline
        self.done = 0
        self.state = UPLINK
        self.uplink_s = 0.0
        self.route_wait_s = 0.0  # part of uplink_s spent waiting for its routing window
        self.queue_s = 0.0
        self.infer_s = 0.0
        self.downlink_s = 0.0
        self.wait_since = 0.0
        self.serve_since = 0.0
        self.down_since = 0.0
        self.conflict = False
        self.mode: Literal["gpu", "cpu", "none"] = "none"
        self.inst: Instance | None = None
        self.lengths: list[tuple[int, int]] | None = None
        self.seqs: list[TokenRequest] = []
        self.first_s = math.inf
        self.prefill_s = 0.0
        self.decode_s = 0.0
        self.board_s = 0.0  # token engines: board-seconds charged (every attempt)
        self.tok_in = 0  # tokens of all K prompts (token engines; 0 for pipeline LMs)
        self.tok_out = 0
        self.tpot_num = 0.0  # sum over finished sequences of (last - first token) ...
        self.tpot_den = 0  # ... and of (output tokens - 1): TPOT = num / den
        self.ttft_s = 0.0
        self.wireless = False  # a user's request: wireless uplink, no downlink (sim/radio.py)


class Instance:
    """A model pod on one node; a token-engine LM's pod also has its `engine`.

    A token pod serves many requests at once, so its `job` stays None; it is
    busy (contends for its GPU or CPU) while its engine runs a step.
    """

    __slots__ = (
        "base_s",
        "binding",
        "cores",
        "engine",
        "engine_busy",
        "job",
        "jobs",
        "kv_bytes",
        "lm",
        "memory",
        "mode",
        "rate",
        "ready",
        "ready_at",
        "since",
        "token",
        "vgpus",
        "vram",
        "work_left",
    )

    def __init__(
        self,
        lm: str,
        mode: Mode,
        cores: float,
        vgpus: int,
        binding: list[tuple[int, int]],
        base_s: float,
        memory: float,
        vram: float,
    ) -> None:
        self.lm = lm
        self.mode: Mode = mode
        self.cores = cores
        self.vgpus = vgpus
        self.binding = binding
        self.base_s = base_s
        self.memory = memory
        self.vram = vram
        self.ready = False
        self.ready_at = 0.0
        self.job: Job | None = None
        self.work_left = 0.0
        self.rate = 0.0
        self.since = 0.0
        self.token = 0
        self.engine: BatchingEngine | None = None
        self.engine_busy = False
        self.kv_bytes = 0  # KV bytes per token of a token engine
        self.jobs: dict[Job, None] = {}  # a token pod's requests in its engine, in order

    @property
    def busy(self) -> bool:
        """Ready and serving: a prompt set (pipeline) or an engine step (token engine)."""
        return self.ready and (self.job is not None or self.engine_busy)


class NodeSim:
    """One node: its queues, pods, GPU slot occupancy and utilization integrals."""

    def __init__(self, info: NodeInfo, lms: list[str]) -> None:
        self.name = info.name
        self.info = info
        self.spec = info.spec
        self.queues: dict[str, deque[Job]] = {lm: deque() for lm in lms}
        # Q_ni kept incrementally: remaining prompts of the jobs queued or in service here
        self.waiting: dict[str, int] = dict.fromkeys(lms, 0)
        self.instances: dict[str, Instance] = {}
        n_gpu = len(self.spec.gpus)
        self.slots_used = [0] * n_gpu
        self.busy_slots = [0] * n_gpu
        self.busy_pods = [0] * n_gpu
        self.t_last = 0.0
        self.cpu_level = 0.0
        self.int_cpu = 0.0
        self.int_gpu = [0.0] * n_gpu
        # (time, int_cpu, int_gpu) at the last read, per reader (snapshot, telemetry)
        self.marks: dict[str, tuple[float, float, list[float], tuple[float, list[float]]]] = {}
        #: KV byte-seconds of the token engines stopped here (live ones: `kv_byte_s`)
        self.kv_byte_s_done = 0.0

    def kv_byte_s(self, now: float) -> float:
        """KV memory-time of this node's token engines so far (byte-seconds)."""
        live = sum(
            i.engine.kv_token_s_at(now) * i.kv_bytes
            for i in self.instances.values()
            if i.engine is not None
        )
        return self.kv_byte_s_done + live

    @property
    def cores_used(self) -> float:
        return sum(i.cores for i in self.instances.values())

    @property
    def memory_used(self) -> float:
        return sum(i.memory for i in self.instances.values())

    @property
    def vram_used(self) -> float:
        return sum(i.vram for i in self.instances.values())

    @property
    def pending(self) -> bool:
        return any(not i.ready for i in self.instances.values())

    def integrate(self, now: float) -> None:
        dt = now - self.t_last
        if dt > 0:
            self.int_cpu += self.cpu_level * dt
            for g, b in enumerate(self.busy_pods):
                if b:
                    self.int_gpu[g] += dt
        self.t_last = now

    def window(self, reader: str, now: float) -> tuple[float, list[float]]:
        """Mean busy CPU cores and per-GPU busy fraction since this reader's last call.

        A second call at the same instant repeats the last window (so two
        readers in one slot see one picture); before any time has passed it
        is the instantaneous state.
        """
        self.integrate(now)
        last = self.marks.get(reader)
        if last is not None and now <= last[0]:
            return last[3]
        t0, c0, g0 = last[:3] if last is not None else (0.0, 0.0, [0.0] * len(self.int_gpu))
        dt = now - t0
        if dt <= 0:
            result = (self.cpu_level, [1.0 if b else 0.0 for b in self.busy_pods])
        else:
            result = (
                (self.int_cpu - c0) / dt,
                [(g - g_0) / dt for g, g_0 in zip(self.int_gpu, g0, strict=True)],
            )
        self.marks[reader] = (now, self.int_cpu, list(self.int_gpu), result)
        return result

    def backlog(self, lm: str) -> int:
        """Q_ni: prompts of `lm` waiting or in service here."""
        return self.waiting[lm]
