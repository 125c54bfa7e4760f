"""The serving engine of an LM service: how its model server turns requests into time.

Two families, chosen by `engine.kind`:

- `pipeline` (the default, what every manifest without `engine` means): one
  prompt at a time per pod, costed in seconds per prompt (`profile`);
- `llama.cpp` and `vllm`: continuous batching at the token level, costed by a
  `TokenProfile`: prefill throughput, decode throughput as a curve over the
  number of running sequences, KV bytes per token, the KV pool, the most
  running sequences and the context length, per GPU model and on CPU.

This module holds the models and the pure functions every consumer (the
hostability check, the deployers, the emulator) calls, so "how many tokens of
KV does a pod of this LM have, and can it run on this node" has one home.
What a token engine's pod reserves is decided here, once:

- GPU mode: the pod reserves `minVramGib` of vRAM (what every deployer already
  budgets); the KV pool is `tokens.kvCacheGib` when given, else
  `minVramGib - weightsGib` (the reservation left after the weights);
- CPU mode: the pod's memory limit `deploymentMemoryGib` holds the weights
  and the pool: `kvCacheGib` when given, else `deploymentMemoryGib - weightsGib`.

It does not model time (that is `lmedge.sim.tokens`), and it does not pick
modes for a placement (`ClusterContext` does, calling `fits`).
"""

from __future__ import annotations

from itertools import pairwise
from typing import TYPE_CHECKING, Literal

from pydantic import Field, model_validator

from lmedge.api.base import PosFloat, SpecModel

if TYPE_CHECKING:
    from lmedge.api.resources import EdgeNodeSpec, LMServiceSpec, ServiceProfile

EngineKind = Literal["pipeline", "llama.cpp", "vllm"]
TOKEN_ENGINES: tuple[EngineKind, ...] = ("llama.cpp", "vllm")
#: The `gpuModel` of the entry that serves any GPU model without an entry of its own.
ANY_GPU = "*"
GIB = 1024**3
#: The request `ServiceProfile` is derived for when a token engine has no
#: `profile`: the mean input and output lengths of LMSYS-Chat-1M (LYREO §V-A).
NOMINAL_INPUT_TOKENS = 70
NOMINAL_OUTPUT_TOKENS = 215


class DecodePoint(SpecModel):
    """Measured decode throughput with `running` sequences in the batch."""

    running: int = Field(ge=1, le=4096, description="Sequences decoding together.")
    tokens_per_s: PosFloat = Field(
        description="Aggregate output tokens/s over all running sequences.", examples=[900.0]
    )


class ThroughputProfile(SpecModel):
    """Prefill and decode speed of one pod on one kind of hardware.

    Decode is a curve of aggregate tokens/s over running sequences, linear
    between points and flat after the last (saturated). It starts at one
    sequence; the aggregate never falls as sequences are added and the
    per-sequence rate never rises (batching shares the hardware, it does not
    speed up one sequence).
    """

    prefill_tokens_per_s: PosFloat = Field(
        description="Prompt tokens/s of a prefill batch.", examples=[4000.0]
    )
    decode: list[DecodePoint] = Field(
        min_length=1,
        max_length=16,
        description="Decode curve: points at distinct running counts, one of them 1.",
    )

    @model_validator(mode="after")
    def _curve(self) -> ThroughputProfile:
        # Sorted here, so the list's order does not matter (the CRD cannot check order).
        pts = sorted(self.decode, key=lambda p: p.running)
        if pts[0].running != 1:
            raise ValueError("decode needs a point with running 1 (the single-sequence rate)")
        for a, b in pairwise(pts):
            if b.running == a.running:
                raise ValueError(f"decode has two points with running {a.running}")
            if b.tokens_per_s < a.tokens_per_s:
                raise ValueError("decode tokensPerS must not fall as running grows")
            if b.tokens_per_s * a.running > a.tokens_per_s * b.running:
                raise ValueError("decode tokensPerS per sequence must not rise as running grows")
        self.decode = pts
        return self

    def decode_tokens_per_s(self, running: int) -> float:
        """Aggregate decode tokens/s with `running` sequences (piecewise linear, flat after)."""
        pts = self.decode
        if running <= pts[0].running:
            return pts[0].tokens_per_s
        for a, b in pairwise(pts):
            if running <= b.running:
                f = (running - a.running) / (b.running - a.running)
                return a.tokens_per_s + f * (b.tokens_per_s - a.tokens_per_s)
        return pts[-1].tokens_per_s


class GpuThroughputProfile(ThroughputProfile):
    """A `ThroughputProfile` for one GPU model (one vGPU, uncontended)."""

    gpu_model: str = Field(
        min_length=1,
        max_length=63,
        description="GPU model as in EdgeNode gpus[].model, or * for any other model.",
        examples=["NVIDIA-RTX-3090"],
    )


class TokenProfile(SpecModel):
    """What a token-level engine needs to be costed: memory and throughput.

    KV bytes per token for a transformer: 2 (K and V) x layers x KV heads x
    head dim x bytes per value (Llama-3.2-1B in fp16: 2 x 16 x 8 x 64 x 2 =
    32 KiB; LYREO uses 16 KiB).
    """

    weights_gib: PosFloat = Field(
        description="Weights and runtime memory of one pod before any KV cache, GiB.",
        examples=[2.5],
    )
    kv_bytes_per_token: int = Field(
        ge=1, le=2**24, description="KV-cache bytes per token held.", examples=[16384]
    )
    kv_cache_gib: PosFloat | None = Field(
        default=None,
        description=(
            "KV pool of one pod, GiB; unset: minVramGib - weightsGib on GPU, "
            "deploymentMemoryGib - weightsGib on CPU."
        ),
    )
    context_tokens: int = Field(
        ge=1, le=2**21, description="Most input + output tokens of one sequence.", examples=[4096]
    )
    max_running_sequences: int = Field(
        default=256, ge=1, le=4096, description="Most sequences in a batch (vLLM max_num_seqs)."
    )
    gpus: list[GpuThroughputProfile] = Field(
        min_length=1,
        max_length=16,
        description="Throughput per GPU model; an entry with gpuModel * serves the others.",
    )
    cpu: ThroughputProfile | None = Field(
        default=None,
        description="Throughput on defaultCpuCores cores; required for cpu-or-gpu services.",
    )

    @model_validator(mode="after")
    def _distinct_gpus(self) -> TokenProfile:
        models = [g.gpu_model for g in self.gpus]
        for m in models:
            if models.count(m) > 1:
                raise ValueError(f"gpus name GPU model {m} more than once")
        return self


#: Where a model claim is mounted (read-only) in a token engine's pod.
MODEL_MOUNT = "/models"
#: A path lmedge puts on a server's command line: absolute, plain characters (no `..`).
_MODEL_PATH = r"^/[A-Za-z0-9._/-]{1,250}$"


class ModelSource(SpecModel):
    """Where a token engine's pod finds its weights: in its image, or in a PVC.

    llama.cpp loads one GGUF file, vLLM a model directory (config and
    safetensors). Without `claimName` the weights are baked into the image at
    `path`; with it, the claim (in the LMService's namespace) is mounted
    read-only at /models and `path` must lie under it. lmedge passes `path`
    to the server itself: there are no free-form arguments.
    """

    path: str = Field(
        default="/models/model.gguf",
        pattern=_MODEL_PATH,
        description="Weights inside the container: a GGUF file (llama.cpp) or a directory (vllm).",
        examples=["/models/model.gguf", "/models/Llama-3.2-1B-Instruct"],
    )
    claim_name: str | None = Field(
        default=None,
        min_length=1,
        max_length=253,
        pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
        description="PersistentVolumeClaim holding the weights, mounted read-only at /models.",
    )

    @model_validator(mode="after")
    def _under_mount(self) -> ModelSource:
        if ".." in self.path.split("/"):
            raise ValueError("path must not contain ..")
        if self.claim_name is not None and not self.path.startswith(MODEL_MOUNT + "/"):
            raise ValueError(f"with claimName, path must lie under {MODEL_MOUNT}/ (the claim)")
        return self


class EngineSpec(SpecModel):
    """The engine of an LM service's pods; absent means `pipeline`."""

    kind: EngineKind = Field(
        default="pipeline", description="pipeline (seconds per prompt), llama.cpp or vllm."
    )
    tokens: TokenProfile | None = Field(
        default=None, description="Token profile; required for llama.cpp and vllm."
    )
    model: ModelSource | None = Field(
        default=None,
        description="Weights of a llama.cpp or vllm pod; unset: /models/model.gguf in the image.",
    )

    @model_validator(mode="after")
    def _tokens(self) -> EngineSpec:
        if self.kind == "pipeline" and self.tokens is not None:
            raise ValueError("engine.tokens is only for llama.cpp and vllm engines")
        if self.kind != "pipeline" and self.tokens is None:
            raise ValueError(f"a {self.kind} engine needs engine.tokens")
        if self.kind == "pipeline" and self.model is not None:
            raise ValueError("engine.model is only for llama.cpp and vllm engines")
        return self

    @property
    def weights(self) -> ModelSource:
        """`model`, or its default (a GGUF baked into the image)."""
        return self.model if self.model is not None else ModelSource()


#: How the gateway talks to a model pod: `pipeline` is `lmedge model-server`
#: (`/infer`, `/infer/stream`); `openai` an engine that speaks the OpenAI API
#: itself (llama.cpp, vLLM: `/v1/chat/completions`, `/v1/completions`).
PodProtocol = Literal["pipeline", "openai"]


def pod_protocol(kind: EngineKind) -> PodProtocol:
    """What a model pod of an engine `kind` speaks: lmedge's pipeline API or OpenAI's.

    The node agent sends it with each pod it registers at its gateway.
    """
    return "pipeline" if kind == "pipeline" else "openai"


Mode = Literal["gpu", "cpu"]


def mixed_batches(kind: EngineKind) -> bool:
    """Whether an engine of `kind` decodes its running sequences in a new prompt's batch.

    llama-server does (measured: `lmedge calibrate --engine llama.cpp`); vLLM is
    modelled as its V0 scheduler, a prefill step alone (not measured here).
    """
    return kind == "llama.cpp"


def concurrent_requests(spec: LMServiceSpec, mode: Mode) -> int:
    """Requests one pod of `spec` serves at once in `mode`: its batch's sequence slots.

    A pipeline pod runs one prompt set at a time (1). llama.cpp gives each of
    its `--parallel` slots a full `contextTokens` context inside the KV pool:
    min(maxRunningSequences, pool / contextTokens), at least 1. vLLM schedules
    up to `--max-num-seqs` = maxRunningSequences. The pod's arguments and the
    gateway's dispatch both use this, so the gateway never sends an engine
    more than it batches, nor serialises what it would batch.
    """
    tokens = spec.engine.tokens
    if tokens is None:
        return 1
    if spec.engine.kind == "vllm":
        return tokens.max_running_sequences
    pool = kv_capacity_tokens(spec, mode)
    return max(1, min(tokens.max_running_sequences, pool // tokens.context_tokens))


def kv_pool_gib(tokens: TokenProfile, held_gib: float) -> float:
    """KV pool of one pod holding `held_gib` (vRAM on GPU, memory on CPU), GiB.

    `kvCacheGib` when given, else what the weights leave of `held_gib`
    (see the module docstring).
    """
    if tokens.kv_cache_gib is not None:
        return tokens.kv_cache_gib
    return held_gib - tokens.weights_gib


def held_gib(spec: LMServiceSpec, mode: Mode) -> float:
    """Memory a pod of `spec` reserves in `mode`: minVramGib (GPU), deploymentMemoryGib (CPU)."""
    return spec.min_vram_gib if mode == "gpu" else spec.deployment_memory_gib


def pool_tokens(tokens: TokenProfile, held: float) -> int:
    """Tokens of KV a pool of `kv_pool_gib(tokens, held)` holds."""
    return max(0, int(kv_pool_gib(tokens, held) * GIB) // tokens.kv_bytes_per_token)


def kv_capacity_tokens(spec: LMServiceSpec, mode: Mode) -> int:
    """Tokens of KV one pod of a token-engine LM can hold in `mode` (0 for pipeline).

    The pool does not depend on the node or on the pod's vGPUs: a pod
    reserves the same memory wherever it runs (time-slicing shares compute,
    not memory); `fits` checks that the node has that memory.
    """
    tokens = spec.engine.tokens
    if tokens is None:
        return 0
    return pool_tokens(tokens, held_gib(spec, mode))


def throughput_profile(
    spec: LMServiceSpec, node: EdgeNodeSpec, mode: Mode
) -> ThroughputProfile | None:
    """The throughput a pod of `spec` has on `node` in `mode`, None if none is given.

    GPU: the entry for the model of the node's first GPU, else the `*` entry
    (a node mixing GPU models is costed as its first GPU).
    """
    tokens = spec.engine.tokens
    if tokens is None:
        return None
    if mode == "cpu":
        return tokens.cpu
    if not node.gpus:
        return None
    by_model = {g.gpu_model: g for g in tokens.gpus}
    return by_model.get(node.gpus[0].model, by_model.get(ANY_GPU))


def fits(spec: LMServiceSpec, node: EdgeNodeSpec, mode: Mode) -> str | None:
    """Why a pod of a token-engine LM cannot run on `node` in `mode`; None when it can.

    Only the engine's own conditions: a throughput profile for the node's
    hardware and the weights plus the KV pool in the node's memory (vRAM in
    GPU mode). The generic ones (role, `runsOn`, cores, memory request) stay
    with the caller. A pipeline engine always fits.
    """
    tokens = spec.engine.tokens
    if tokens is None:
        return None
    if throughput_profile(spec, node, mode) is None:
        if mode == "gpu":
            model = node.gpus[0].model if node.gpus else "none"
            return f"no token profile for GPU model {model} and no {ANY_GPU} entry"
        return "no CPU token profile (engine.tokens.cpu)"
    pool = kv_pool_gib(tokens, held_gib(spec, mode))
    need = tokens.weights_gib + pool
    have = node.total_vram_gib if mode == "gpu" else node.memory_gib
    if need > have + 1e-9:
        where = "vRAM" if mode == "gpu" else "memory"
        return (
            f"weights {tokens.weights_gib:g} GiB + KV cache {pool:g} GiB "
            f"exceed the node's {have:g} GiB {where}"
        )
    return None


def nominal_seconds_per_prompt(
    tokens: TokenProfile, profile: ThroughputProfile, capacity_tokens: int
) -> float:
    """Seconds per prompt a per-prompt policy may plan with: the nominal request at saturation.

    With R = min(maxRunningSequences, capacity / (in + out)) sequences in the
    batch, a pod completes requests at decode(R) / out per second, so one
    request costs out / decode(R) + in / prefill seconds of the pod
    (capacity-equivalent: a single request alone takes longer).
    """
    per_seq = NOMINAL_INPUT_TOKENS + NOMINAL_OUTPUT_TOKENS
    running = max(1, min(tokens.max_running_sequences, capacity_tokens // per_seq))
    return saturated_seconds_per_request(profile, running)


def saturated_seconds_per_request(profile: ThroughputProfile, running: int) -> float:
    """Seconds of a pod each nominal request costs while `running` sequences decode.

    Its `out` tokens at decode(running) / running tokens/s each, in a batch
    that finishes decode(running) / out requests a second, plus its prefill,
    which stalls the running batch (vLLM's V0 scheduler, `BatchingEngine`):
    out / decode(running) + in / prefill. The reciprocal is the pod's
    throughput at saturation, so it is also how fast a full pod's waiting
    queue drains.
    """
    return (
        NOMINAL_OUTPUT_TOKENS / profile.decode_tokens_per_s(running)
        + NOMINAL_INPUT_TOKENS / profile.prefill_tokens_per_s
    )


def derived_profile(
    tokens: TokenProfile, min_vram_gib: float, deployment_memory_gib: float
) -> ServiceProfile:
    """The `profile` of a token-engine LM that gives none (see `nominal_seconds_per_prompt`).

    GPU seconds from the first `gpus` entry (list the reference GPU first),
    CPU seconds from `cpu` when given; text payloads (1 KiB each way).
    """
    from lmedge.api.resources import ServiceProfile

    gpu = nominal_seconds_per_prompt(tokens, tokens.gpus[0], pool_tokens(tokens, min_vram_gib))
    cpu = None
    if tokens.cpu is not None:
        cpu_pool = pool_tokens(tokens, deployment_memory_gib)
        cpu = nominal_seconds_per_prompt(tokens, tokens.cpu, cpu_pool)
    return ServiceProfile(gpu_seconds_per_prompt=gpu, cpu_seconds_per_prompt=cpu)


__all__ = [
    "ANY_GPU",
    "MODEL_MOUNT",
    "NOMINAL_INPUT_TOKENS",
    "NOMINAL_OUTPUT_TOKENS",
    "TOKEN_ENGINES",
    "DecodePoint",
    "EngineKind",
    "EngineSpec",
    "GpuThroughputProfile",
    "ModelSource",
    "PodProtocol",
    "ThroughputProfile",
    "TokenProfile",
    "concurrent_requests",
    "derived_profile",
    "fits",
    "held_gib",
    "kv_capacity_tokens",
    "kv_pool_gib",
    "mixed_batches",
    "pod_protocol",
    "pool_tokens",
    "saturated_seconds_per_request",
    "throughput_profile",
]
