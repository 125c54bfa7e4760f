"""Specs of the two custom resources: `LMService` and `EdgeNode` (group lmedge.io).

These are the single source of truth for the CRD schemas (`lmedge crds`), the
emulator's cluster (`examples/*` are the same YAML a user applies) and the
static context every agent sees. Units are in field names (`_gib`, `_s`,
`_mbps`) so nobody has to guess.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from lmedge.api.base import ImageRef, K8sName, NonNegFloat, PosFloat, SpecModel
from lmedge.api.engines import GIB, EngineSpec, derived_profile, kv_pool_gib

API_GROUP = "lmedge.io"
API_VERSION = "v1alpha1"

#: Kubernetes' CPU granularity (1m): a pod's cores are rounded to it.
CPU_QUANTUM_CORES = 0.001
#: Default fewest cores of a model pod (100m): below that a model server cannot
#: even load, and a smaller limit would only turn a placement into a stall.
MIN_CPU_CORES = 0.1

Modality = Literal[
    "text-to-text",
    "image-to-text",
    "text-to-image",
    "image-to-image",
    "audio-to-text",
    "text-to-audio",
]
#: Where an LM can run. `gpu-only` models (image generation, BLIP) are never placed on CPU.
RunsOn = Literal["gpu-only", "cpu-or-gpu"]


class ServiceProfile(SpecModel):
    """Profiled cost of one prompt, used by planners, the MILP and the emulator.

    `gpu_seconds_per_prompt` is the uncontended service time of one busy instance
    holding one vGPU; `cpu_seconds_per_prompt` the time on `defaultCpuCores`
    cores. Payload sizes drive the uplink/downlink delays (text vs images).
    """

    gpu_seconds_per_prompt: PosFloat = Field(
        description="Seconds per prompt on one uncontended vGPU.", examples=[5.2]
    )
    cpu_seconds_per_prompt: PosFloat | None = Field(
        default=None,
        description="Seconds per prompt on the default CPU cores; required for cpu-or-gpu LMs.",
        examples=[8.2],
    )
    request_kib: NonNegFloat = Field(
        default=1.0, description="Uplink payload per prompt in KiB (text ~1, image ~200)."
    )
    response_kib: NonNegFloat = Field(
        default=1.0, description="Downlink payload per prompt in KiB (text ~1, image ~500)."
    )


class LMServiceSpec(SpecModel):
    """One LM service: a model image and what it needs to run."""

    model: str = Field(min_length=1, description="Model id, e.g. gpt2.", examples=["gpt2"])
    modality: Modality = Field(description="Input-to-output modality of the service.")
    image: ImageRef = Field(
        description="Container image of the model server (a reference: no spaces).",
        examples=["ghcr.io/lmedge/model-server-gpt2:0.1.0"],
    )
    deployment_memory_gib: PosFloat = Field(
        description="Memory request=limit of a model pod, GiB.", examples=[3.0]
    )
    min_memory_gib: PosFloat = Field(
        description="Minimum memory the model needs to load, GiB.", examples=[1.2]
    )
    min_vram_gib: NonNegFloat = Field(
        default=0.0, description="Minimum GPU memory when placed on GPU, GiB."
    )
    runs_on: RunsOn = Field(description="gpu-only, or cpu-or-gpu.")
    default_cpu_cores: PosFloat = Field(
        default=4.0, description="CPU cores of a pod unless a deployer decides otherwise."
    )
    # A floor on what a deployer may give a pod: without it a placement of 1e-9
    # cores passes and becomes `cpu: 0` on the pod (no request, no limit).
    min_cpu_cores: float = Field(
        default=MIN_CPU_CORES,
        ge=CPU_QUANTUM_CORES,
        description=(
            "Fewest CPU cores a pod of this LM may be given (requests = limits), "
            "at least 0.001 (Kubernetes' 1m granularity); at most defaultCpuCores."
        ),
    )
    max_vgpus: int = Field(default=2, ge=1, le=16, description="Most vGPUs one pod may take.")
    deadline_s: PosFloat | None = Field(
        default=None, description="Per-service deadline; the cluster-wide tau when unset."
    )
    serves: list[K8sName] = Field(
        default_factory=list,
        max_length=32,
        description=(
            "Request classes this LM can serve besides its own name, e.g. two text "
            "LMs both serving class `chat` (model routing)."
        ),
    )
    quality: float | None = Field(
        default=None, ge=0, le=1, description="Prior answer quality in [0, 1] for model routing."
    )
    # Declared before `profile`, which is derived from it when absent.
    engine: EngineSpec = Field(
        default_factory=EngineSpec,
        description="Serving engine; absent: pipeline (seconds per prompt from profile).",
    )
    profile: ServiceProfile = Field(
        default=None,  # type: ignore[assignment]  # derived by _derive_profile
        description=(
            "Seconds per prompt; required for the pipeline engine, derived from "
            "engine.tokens when a llama.cpp or vllm engine has none."
        ),
    )

    @field_validator("profile", mode="before")
    @classmethod
    def _derive_profile(cls, value: Any, info: ValidationInfo) -> Any:
        if value is not None:
            return value
        engine = info.data.get("engine")
        if engine is None:  # the engine is invalid: its own error says why
            return value
        if engine.tokens is None:
            raise ValueError("a pipeline engine needs profile (seconds per prompt)")
        vram, memory = info.data.get("min_vram_gib"), info.data.get("deployment_memory_gib")
        if vram is None or memory is None:
            return value
        return derived_profile(engine.tokens, vram, memory)

    @model_validator(mode="after")
    def _cross_field(self) -> LMServiceSpec:
        if self.min_memory_gib > self.deployment_memory_gib:
            raise ValueError(
                f"minMemoryGib ({self.min_memory_gib}) must not exceed "
                f"deploymentMemoryGib ({self.deployment_memory_gib})"
            )
        if self.min_cpu_cores > self.default_cpu_cores:
            raise ValueError(
                f"minCpuCores ({self.min_cpu_cores}) must not exceed "
                f"defaultCpuCores ({self.default_cpu_cores})"
            )
        self._check_token_memory()
        if self.runs_on == "cpu-or-gpu" and self.profile.cpu_seconds_per_prompt is None:
            raise ValueError("a cpu-or-gpu service needs profile.cpuSecondsPerPrompt")
        return self

    def _check_token_memory(self) -> None:
        """A token engine's pod holds its weights and a KV pool of at least one full context."""
        tokens = self.engine.tokens
        if tokens is None:
            return
        if self.runs_on == "cpu-or-gpu" and tokens.cpu is None:
            raise ValueError("a cpu-or-gpu service with a token engine needs engine.tokens.cpu")
        context_gib = tokens.context_tokens * tokens.kv_bytes_per_token / GIB
        held = [("minVramGib", self.min_vram_gib)]
        if self.runs_on == "cpu-or-gpu":
            held.append(("deploymentMemoryGib", self.deployment_memory_gib))
        for name, gib in held:
            pool = kv_pool_gib(tokens, gib)
            if tokens.weights_gib + pool > gib + 1e-9:
                raise ValueError(
                    f"engine.tokens: weightsGib + kvCacheGib ({tokens.weights_gib + pool:g}) "
                    f"must not exceed {name} ({gib:g})"
                )
            if pool < context_gib:
                raise ValueError(
                    f"engine.tokens: the KV pool within {name} ({pool:g} GiB) must hold "
                    f"one contextTokens sequence ({context_gib:.3g} GiB)"
                )


class GPUSpec(SpecModel):
    """One physical GPU."""

    model: str = Field(default="generic", description="GPU model, e.g. NVIDIA-A5000.")
    vram_gib: PosFloat = Field(description="GPU memory, GiB.", examples=[24.0])


class SiteLink(SpecModel):
    """The network path from this node's site to another site."""

    site: K8sName
    bandwidth_mbps: PosFloat = Field(description="Throughput to that site, Mbit/s.")
    latency_ms: NonNegFloat = Field(description="One-way latency to that site, ms.")


class PowerProfile(SpecModel):
    """Power and price of a node, for energy- and cost-aware routing (CEMA).

    A busy pod draws its board power (`busyWattsPerGpu`, or per core on CPU)
    times `utilization`. Token prices are what an API charges per 1,000
    tokens served here (0 when self-hosted); `transferPricePerGib` is metered
    transfer to and from the node.
    """

    idle_watts: NonNegFloat = 50.0
    busy_watts_per_core: NonNegFloat = 5.0
    busy_watts_per_gpu: NonNegFloat = 230.0
    cost_per_hour: NonNegFloat = Field(default=0.0, description="Monetary cost, any currency.")
    utilization: float = Field(
        default=1.0, gt=0, le=1, description="Share of the busy power drawn while serving."
    )
    input_price_per_1k: NonNegFloat = Field(
        default=0.0, description="Price of 1,000 input tokens served here, any currency."
    )
    output_price_per_1k: NonNegFloat = Field(
        default=0.0, description="Price of 1,000 output tokens served here, any currency."
    )
    transfer_price_per_gib: NonNegFloat = Field(
        default=0.0, description="Metered transfer to and from the node, per GiB."
    )


class EdgeNodeSpec(SpecModel):
    """A cluster node's capacity as lmedge plans with it (named after its Node)."""

    role: Literal["worker", "control"] = Field(
        default="worker", description="Control nodes run the controller and host no LMs."
    )
    cpu_cores: PosFloat = Field(description="Allocatable CPU cores.", examples=[16])
    memory_gib: PosFloat = Field(description="Allocatable memory, GiB.", examples=[24])
    # List bounds keep the CRD's CEL rules within the API server's cost budget.
    gpus: list[GPUSpec] = Field(default_factory=list, max_length=16, description="Physical GPUs.")
    vgpus_per_gpu: int = Field(
        default=1,
        ge=1,
        le=48,
        description="Time-slicing replicas per GPU (NVIDIA device plugin sharing.timeSlicing).",
    )
    site: K8sName = Field(default="site-a", description="Location; links are per site pair.")
    intra_site_bandwidth_mbps: PosFloat = Field(default=10_000.0)
    intra_site_latency_ms: NonNegFloat = Field(default=0.5)
    links: list[SiteLink] = Field(
        default_factory=list, max_length=64, description="Paths to other sites."
    )
    power: PowerProfile | None = None
    tier: Literal["edge", "cloud"] = Field(
        default="edge", description="Edge or cloud node (Cloud-Only / Edge-Only routing)."
    )

    @property
    def total_vgpus(self) -> int:
        return len(self.gpus) * self.vgpus_per_gpu

    @property
    def total_vram_gib(self) -> float:
        return sum(g.vram_gib for g in self.gpus)

    @property
    def has_gpu(self) -> bool:
        return bool(self.gpus)

    @model_validator(mode="after")
    def _cross_field(self) -> EdgeNodeSpec:
        sites = [link.site for link in self.links]
        if len(sites) != len(set(sites)):
            raise ValueError("links name the same site more than once")
        if self.site in sites:
            raise ValueError(f"links must not include the node's own site {self.site!r}")
        return self
