"""Records of what happened: one per prompt set, node telemetry, memory cases."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from lmedge.api.base import WireModel
from lmedge.api.engine_telemetry import EngineTelemetry, kv_usage

#: `success`: served within its deadline; `timeout`: not served by the deadline
#: (or failed on the way); `rejected`: refused at once by admission control,
#: without being queued anywhere; `node_lost`: queued or in flight at a node
#: that went away (deleted, NotReady, cordoned or drained) and not re-dispatched;
#: `lm_removed`: its LMService was deleted before it was served; `failed`: a
#: streamed request whose engine failed or refused it (a malformed stream, an
#: engine that died, a prompt too long for its context); `cancelled`: a streamed
#: request whose client disconnected before its end. Only `success` counts as
#: delta_q = 1; every other outcome is a failure in every metric.
RequestOutcome = Literal[
    "success", "timeout", "rejected", "node_lost", "lm_removed", "failed", "cancelled"
]


class RequestRecord(WireModel):
    """One request (a set of K prompts for one LM) and its four stage timings.

    `conflict` is True when the request reached a destination where its LM was
    not active on arrival (an inactive-target conflict); it may still succeed
    if the LM is activated there before the deadline. A timed-out request keeps
    the stage times reached by the deadline, so latency is `tau` for it.

    A `rejected` request was refused by the origin's gateway (the slot's
    routing map rejects its (origin, LM) pair): `destination` is the origin,
    the node that answered it, `mode` is none, `conflict` is False (it reached
    no destination) and its stage times are what the refusal took (0 in the
    emulator). It is a failure like a timeout in every metric.

    A streamed request (`stream: true`) also has token-level fields: `ttft_s`
    (submit to the first token at the origin), `tpot_s` (mean time per output
    token after the first), `input_tokens` / `output_tokens`, and the split of
    `inference_s` into `prefill_s` (to the first token) and `decode_s` (the
    rest), so uplink + queue + prefill + decode + downlink is its latency.
    They are None for prompt sets and for records written before streaming.
    """

    id: str
    run: str = ""
    lm: str
    model: str | None = Field(
        default=None,
        description="LM that served it when `lm` is a request class; None means `lm` itself.",
    )
    origin: str
    destination: str
    prompts: int = Field(ge=0)
    prompts_done: int = Field(default=0, ge=0)
    slot: int = Field(ge=0)
    submit_s: float = Field(ge=0, description="Submit time on the run clock, seconds.")
    uplink_s: float = Field(default=0.0, ge=0)
    queue_s: float = Field(default=0.0, ge=0, description="Waiting, including cold start.")
    inference_s: float = Field(default=0.0, ge=0)
    downlink_s: float = Field(default=0.0, ge=0)
    outcome: RequestOutcome
    conflict: bool = False
    mode: Literal["gpu", "cpu", "none"] = Field(
        default="none", description="Where it was served; none if it never ran."
    )
    error: str | None = Field(
        default=None,
        description="Why it failed when not by the deadline, e.g. an unreachable destination.",
    )
    ttft_s: float | None = Field(
        default=None, ge=0, description="Streamed: time to the first token at the origin, s."
    )
    tpot_s: float | None = Field(
        default=None, ge=0, description="Streamed: mean time per output token after the first, s."
    )
    input_tokens: int | None = Field(default=None, ge=0, description="Streamed: prompt tokens.")
    output_tokens: int | None = Field(
        default=None, ge=0, description="Streamed: generated tokens (engine usage, else chunks)."
    )
    prefill_s: float | None = Field(
        default=None, ge=0, description="Streamed: the part of inference_s to the first token."
    )
    decode_s: float | None = Field(
        default=None, ge=0, description="Streamed: the part of inference_s after the first token."
    )
    energy_j: float | None = Field(
        default=None,
        ge=0,
        description=(
            "Emulated: board-seconds x the serving mode's board power x utilization "
            "+ transfer seconds x RADIO_WATTS, where board-seconds are the inference "
            "seconds of a pipeline LM and, on a token engine, the request's share of each "
            "batched step; None where not modelled."
        ),
    )

    @property
    def latency_s(self) -> float:
        """End-to-end latency T_q = uplink + queue + inference + downlink."""
        return self.uplink_s + self.queue_s + self.inference_s + self.downlink_s

    @property
    def done_s(self) -> float:
        return self.submit_s + self.latency_s


#: The token-level fields of a record that was not streamed (every emulator
#: record), for code that builds records naming every field (`api.base.built`).
NOT_STREAMED: dict[str, None] = dict.fromkeys(
    ("ttft_s", "tpot_s", "input_tokens", "output_tokens", "prefill_s", "decode_s")
)


class NodeTelemetry(WireModel):
    """A snapshot of one node's resource use (from exporters or the emulator).

    `engines`: one entry per token-engine pod (llama.cpp, vLLM) on the node;
    None when the node runs none or none was read yet, so snapshots of
    pipeline-only nodes (and documents written before) read the same.
    """

    run: str = ""
    node: str
    time_s: float = Field(ge=0)
    cpu_util: float = Field(ge=0, le=1)
    memory_util: float = Field(ge=0, le=1)
    gpu_util: list[float] = Field(default_factory=list)
    vram_used_gib: list[float] = Field(default_factory=list)
    source: Literal["emulator", "exporter", "prometheus"] = "emulator"
    extra: dict[str, float] = Field(default_factory=dict)
    engines: list[EngineTelemetry] | None = Field(
        default=None, description="Token-engine pods on the node; None without any."
    )

    @property
    def kv_usage_max(self) -> float | None:
        """The fullest KV cache of the node's engine pods (0..1); None without a reading."""
        usage = kv_usage(self.engines)
        return usage[0] if usage else None

    @property
    def kv_usage_mean(self) -> float | None:
        """The mean KV-cache usage of the node's engine pods (0..1); None without a reading."""
        usage = kv_usage(self.engines)
        return usage[1] if usage else None
