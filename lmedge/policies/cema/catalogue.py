"""CEMA's destination catalogue: (node, model) pairs with what the paper's profiler knows.

A destination carries the token prices of its node, its model's throughput
there (single-request and saturated-batch decode, prefill; or seconds per
prompt for a pipeline engine), the board power and utilization of the mode
it serves in, and the router-to-endpoint path (one-way latency, goodput).
From these, `Destination.service`, `.cost` and `.energy` give one request's
terms; `requests.py` turns them into the evaluator's matrices.

`from_context` builds the catalogue of a cluster (the emulator and the
cluster use it); a controlled experiment builds `Destination`s directly (no
cluster, see `requests.controlled_batch`). It does not track backlog (the
router's `Monitor` does) nor predict quality (`quality.py`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from lmedge.api import ClusterContext, PowerProfile
from lmedge.api.engines import Mode, throughput_profile
from lmedge.policies.kit.estimates import service_s

#: KiB in a GiB, for metered transfer.
KIB_PER_GIB = 1024.0**2


@dataclass(frozen=True)
class Destination:
    """One (node, model) a request can be sent to, with its profiled figures.

    A token engine has `seconds_per_prompt` None and its throughputs in
    tokens/s; a pipeline engine serves a prompt in `seconds_per_prompt`,
    alone or not (no batching).
    """

    node: str
    model: str
    tier: str = "edge"
    input_price_per_1k: float = 0.0
    output_price_per_1k: float = 0.0
    transfer_price_per_gib: float = 0.0
    prefill_tokens_per_s: float = 4000.0
    single_tokens_per_s: float = 50.0  # F_1: decode rate of one sequence alone
    batch_tokens_per_s: float = 800.0  # F_B: aggregate decode rate of a saturated batch
    seconds_per_prompt: float | None = None
    watts: float = 230.0
    utilization: float = 1.0
    latency_s: float = 0.005  # one-way, router (or origin) to endpoint
    goodput_bps: float = 1e9

    def service(
        self, input_tokens: int, output_tokens: int, prompts: int = 1
    ) -> tuple[float, float]:
        """(busy, alone) seconds of a request here.

        busy: its share of the engine at the saturated rate,
        `in / prefill + out / F_B` (what it adds to the destination's queue);
        alone: `in / prefill + out / F_1`, the soonest it can finish.
        """
        if self.seconds_per_prompt is not None:
            s = prompts * self.seconds_per_prompt
            return s, s
        prefill = input_tokens / self.prefill_tokens_per_s
        return (
            prefill + output_tokens / self.batch_tokens_per_s,
            prefill + output_tokens / self.single_tokens_per_s,
        )

    def cost(self, input_tokens: int, output_tokens: int, kib: float) -> float:
        """Token prices x tokens + metered transfer (0 when self-hosted)."""
        return (
            input_tokens * self.input_price_per_1k / 1000.0
            + output_tokens * self.output_price_per_1k / 1000.0
            + kib / KIB_PER_GIB * self.transfer_price_per_gib
        )

    def energy(self, busy_s: float) -> float:
        """Processing joules: busy seconds x board power x utilization."""
        return busy_s * self.watts * self.utilization


def from_context(ctx: ClusterContext, pairs: list[tuple[str, str]]) -> list[Destination]:
    """The catalogue entries of `pairs` (node, model) in a cluster, in that order.

    Each serves in the node's fastest mode (GPU before CPU). Throughput comes
    from the LM's token profile for the node's hardware
    (`engines.throughput_profile`): F_1 is the decode rate with one sequence,
    F_B with `maxRunningSequences`; a pipeline LM uses its seconds per prompt.
    Links are per origin, so the catalogue's `latency_s`/`goodput_bps` are
    left at their defaults here (`requests.window_batch` uses the cluster's links).
    """
    out: list[Destination] = []
    for n, m in pairs:
        node, spec = ctx.node(n).spec, ctx.service(m).spec
        power = node.power or PowerProfile()
        modes = ctx.modes(n, m)
        mode: Mode = "cpu" if modes and modes[0] == "cpu" else "gpu"
        watts = (
            power.busy_watts_per_gpu
            if mode == "gpu"
            else power.busy_watts_per_core * spec.default_cpu_cores
        )
        base = Destination(
            node=n,
            model=m,
            tier=node.tier,
            input_price_per_1k=power.input_price_per_1k,
            output_price_per_1k=power.output_price_per_1k,
            transfer_price_per_gib=power.transfer_price_per_gib,
            watts=watts,
            utilization=power.utilization,
        )
        prof = throughput_profile(spec, node, mode)
        tokens = spec.engine.tokens
        if prof is None or tokens is None:
            out.append(replace(base, seconds_per_prompt=service_s(ctx, m, mode)))
        else:
            out.append(
                replace(
                    base,
                    prefill_tokens_per_s=prof.prefill_tokens_per_s,
                    single_tokens_per_s=prof.decode_tokens_per_s(1),
                    batch_tokens_per_s=prof.decode_tokens_per_s(tokens.max_running_sequences),
                )
            )
    return out
