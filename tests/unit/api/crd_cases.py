"""Invalid `LMService` / `EdgeNode` manifests and how each one is rejected.

Shared by the unit tests (pydantic, the generated OpenAPI schema and CEL rules
evaluated in-process) and by the cluster tests that apply the same manifests
to a real kube-apiserver. `how` names the mechanism that rejects the object on
the API server:

- `schema`: the structural OpenAPI schema (type, enum, bounds, pattern, required);
- `cel`: an `x-kubernetes-validations` rule;
- `list-map`: duplicate keys in an `x-kubernetes-list-type: map` list;
- `unknown-field`: a field the schema does not know; the API server prunes it,
  and rejects the request under strict field validation (kubectl's default).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from lmedge.api.resources import API_GROUP, API_VERSION

How = Literal["schema", "cel", "list-map", "unknown-field"]

#: A valid LMService spec (the testbed's LM1, cpu-or-gpu).
LMSERVICE: dict[str, Any] = {
    "model": "gpt2",
    "modality": "text-to-text",
    "image": "ghcr.io/lmedge/model-server-gpt2:0.1.0",
    "minMemoryGib": 1.2,
    "deploymentMemoryGib": 3,
    "minVramGib": 1.0,
    "runsOn": "cpu-or-gpu",
    "defaultCpuCores": 4,
    "maxVgpus": 2,
    "serves": ["text-generation"],
    "profile": {"gpuSecondsPerPrompt": 5.17, "cpuSecondsPerPrompt": 8.15},
}

#: A valid LMService spec with a token engine (Llama-3.2-1B-like, llama.cpp, cpu-or-gpu):
#: GPU pool 6 - 2.5 = 3.5 GiB, CPU pool 8 - 2.5 = 5.5 GiB, a context needs 0.125 GiB.
TOKEN_LMSERVICE: dict[str, Any] = {
    "model": "llama-3.2-1b",
    "modality": "text-to-text",
    "image": "ghcr.io/lmedge/llama-cpp:0.1.0",
    "minMemoryGib": 4.0,
    "deploymentMemoryGib": 8.0,
    "minVramGib": 6.0,
    "runsOn": "cpu-or-gpu",
    "engine": {
        "kind": "llama.cpp",
        "tokens": {
            "weightsGib": 2.5,
            "kvBytesPerToken": 32768,
            "contextTokens": 4096,
            "maxRunningSequences": 64,
            "gpus": [
                {
                    "gpuModel": "NVIDIA-RTX-3090",
                    "prefillTokensPerS": 4000,
                    "decode": [
                        {"running": 1, "tokensPerS": 90},
                        {"running": 16, "tokensPerS": 1000},
                        {"running": 64, "tokensPerS": 2000},
                    ],
                },
                {
                    "gpuModel": "*",
                    "prefillTokensPerS": 2500,
                    "decode": [
                        {"running": 1, "tokensPerS": 60},
                        {"running": 64, "tokensPerS": 1200},
                    ],
                },
            ],
            "cpu": {
                "prefillTokensPerS": 150,
                "decode": [{"running": 1, "tokensPerS": 12}, {"running": 8, "tokensPerS": 40}],
            },
        },
    },
}

#: A valid EdgeNode spec (a single-GPU worker with two remote sites).
EDGENODE: dict[str, Any] = {
    "role": "worker",
    "cpuCores": 16,
    "memoryGib": 24,
    "gpus": [{"model": "NVIDIA-A5000", "vramGib": 24}],
    "vgpusPerGpu": 2,
    "site": "uob",
    "links": [
        {"site": "wtc", "bandwidthMbps": 1000, "latencyMs": 2},
        {"site": "mshed", "bandwidthMbps": 1000, "latencyMs": 2},
    ],
}


@dataclass(frozen=True)
class Case:
    id: str
    kind: Literal["LMService", "EdgeNode"]
    how: How
    edit: Callable[[dict[str, Any]], None]
    #: The valid spec the edit starts from; None: LMSERVICE or EDGENODE by kind.
    base: dict[str, Any] | None = None

    def valid_spec(self) -> dict[str, Any]:
        """The valid spec the edit starts from."""
        return self.base or (LMSERVICE if self.kind == "LMService" else EDGENODE)

    def spec(self) -> dict[str, Any]:
        spec = copy.deepcopy(self.valid_spec())
        self.edit(spec)
        return spec

    def manifest(self, name: str | None = None) -> dict[str, Any]:
        """The full object to apply (LMServices go to the caller's namespace)."""
        return {
            "apiVersion": f"{API_GROUP}/{API_VERSION}",
            "kind": self.kind,
            "metadata": {"name": name or f"bad-{self.id}"},
            "spec": self.spec(),
        }


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(spec: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = spec
        for p in parents:
            node = node[int(p)] if isinstance(node, list) else node[p]
        if isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value

    return edit


def _drop(path: str) -> Callable[[dict[str, Any]], None]:
    def edit(spec: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = spec
        for p in parents:
            node = node[int(p)] if isinstance(node, list) else node[p]
        del node[last]

    return edit


def _both(*edits: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], None]:
    def edit(spec: dict[str, Any]) -> None:
        for e in edits:
            e(spec)

    return edit


INVALID: list[Case] = [
    Case("lms-missing-model", "LMService", "schema", _drop("model")),
    Case("lms-empty-image", "LMService", "schema", _set("image", "")),
    Case("lms-image-with-space", "LMService", "schema", _set("image", "ghcr.io/x/y:1 --rm")),
    Case("lms-image-with-newline", "LMService", "schema", _set("image", "ghcr.io/x/y:1\nz")),
    Case("lms-unknown-modality", "LMService", "schema", _set("modality", "video-to-text")),
    Case("lms-zero-memory", "LMService", "schema", _set("deploymentMemoryGib", 0)),
    Case("lms-memory-is-text", "LMService", "schema", _set("deploymentMemoryGib", "3Gi")),
    Case("lms-negative-vram", "LMService", "schema", _set("minVramGib", -1)),
    Case("lms-unknown-runs-on", "LMService", "schema", _set("runsOn", "tpu")),
    Case("lms-max-vgpus-zero", "LMService", "schema", _set("maxVgpus", 0)),
    Case("lms-max-vgpus-too-many", "LMService", "schema", _set("maxVgpus", 17)),
    Case("lms-quality-above-one", "LMService", "schema", _set("quality", 1.5)),
    Case("lms-zero-deadline", "LMService", "schema", _set("deadlineS", 0)),
    Case("lms-serves-bad-name", "LMService", "schema", _set("serves", ["Chat_Bot"])),
    Case(
        "lms-serves-too-many",
        "LMService",
        "schema",
        _set("serves", [f"class-{i}" for i in range(33)]),
    ),
    Case("lms-missing-profile", "LMService", "cel", _drop("profile")),
    Case(
        "lms-negative-gpu-seconds", "LMService", "schema", _set("profile.gpuSecondsPerPrompt", -1)
    ),
    Case(
        "lms-min-memory-above-deployment",
        "LMService",
        "cel",
        _both(_set("minMemoryGib", 10), _set("deploymentMemoryGib", 9)),
    ),
    Case("lms-min-cpu-above-default", "LMService", "cel", _set("minCpuCores", 8)),
    Case("lms-min-cpu-below-1m", "LMService", "schema", _set("minCpuCores", 0.0001)),
    Case("lms-cpu-without-cpu-profile", "LMService", "cel", _drop("profile.cpuSecondsPerPrompt")),
    Case("lms-cpu-profile-null", "LMService", "cel", _set("profile.cpuSecondsPerPrompt", None)),
    Case("lms-unknown-field", "LMService", "unknown-field", _set("replicas", 3)),
    Case("lms-unknown-profile-field", "LMService", "unknown-field", _set("profile.tokens", 1)),
    Case("lms-unknown-engine", "LMService", "schema", _set("engine", {"kind": "tgi"})),
    Case("lms-vllm-without-tokens", "LMService", "cel", _set("engine", {"kind": "vllm"})),
    Case(
        "lms-pipeline-with-tokens",
        "LMService",
        "cel",
        _set("engine", {"kind": "pipeline", "tokens": TOKEN_LMSERVICE["engine"]["tokens"]}),
    ),
    *[
        Case(f"lms-tokens-{id_}", "LMService", how, edit, TOKEN_LMSERVICE)
        for id_, how, edit in [
            ("pipeline-kind", "cel", _set("engine.kind", "pipeline")),
            ("zero-kv-bytes", "schema", _set("engine.tokens.kvBytesPerToken", 0)),
            ("no-gpus", "schema", _set("engine.tokens.gpus", [])),
            ("missing-weights", "schema", _drop("engine.tokens.weightsGib")),
            ("cpu-or-gpu-without-cpu", "cel", _drop("engine.tokens.cpu")),
            ("no-single-sequence", "cel", _set("engine.tokens.gpus.0.decode.0.running", 2)),
            ("decode-falls", "cel", _set("engine.tokens.gpus.0.decode.2.tokensPerS", 500)),
            ("per-sequence-rises", "cel", _set("engine.tokens.gpus.0.decode.0.tokensPerS", 50)),
            ("cpu-decode-falls", "cel", _set("engine.tokens.cpu.decode.1.tokensPerS", 10)),
            ("duplicate-running", "list-map", _set("engine.tokens.gpus.0.decode.1.running", 1)),
            (
                "duplicate-gpu-model",
                "list-map",
                _set("engine.tokens.gpus.1.gpuModel", "NVIDIA-RTX-3090"),
            ),
            ("kv-cache-over-vram", "cel", _set("engine.tokens.kvCacheGib", 4)),
            ("pool-below-context", "cel", _set("engine.tokens.contextTokens", 131072)),
            (
                "cpu-pool-below-context",
                "cel",
                _both(_set("deploymentMemoryGib", 2.6), _set("minMemoryGib", 2.0)),
            ),
            ("unknown-field", "unknown-field", _set("engine.tokens.kvBytes", 1)),
        ]
    ],
    Case("en-missing-cpu", "EdgeNode", "schema", _drop("cpuCores")),
    Case("en-negative-memory", "EdgeNode", "schema", _set("memoryGib", -24)),
    Case("en-unknown-role", "EdgeNode", "schema", _set("role", "master")),
    Case("en-zero-vgpus-per-gpu", "EdgeNode", "schema", _set("vgpusPerGpu", 0)),
    Case("en-vgpus-per-gpu-too-many", "EdgeNode", "schema", _set("vgpusPerGpu", 49)),
    Case("en-vgpus-fractional", "EdgeNode", "schema", _set("vgpusPerGpu", 1.5)),
    Case("en-gpu-without-vram", "EdgeNode", "schema", _drop("gpus.0.vramGib")),
    Case("en-too-many-gpus", "EdgeNode", "schema", _set("gpus", [{"vramGib": 24}] * 17)),
    Case("en-bad-site-name", "EdgeNode", "schema", _set("site", "Site A")),
    Case("en-link-without-latency", "EdgeNode", "schema", _drop("links.0.latencyMs")),
    Case("en-link-zero-bandwidth", "EdgeNode", "schema", _set("links.0.bandwidthMbps", 0)),
    Case("en-negative-power", "EdgeNode", "schema", _set("power", {"idleWatts": -5})),
    Case("en-link-to-own-site", "EdgeNode", "cel", _set("links.1.site", "uob")),
    Case("en-duplicate-link-site", "EdgeNode", "list-map", _set("links.1.site", "wtc")),
    Case("en-unknown-field", "EdgeNode", "unknown-field", _set("gpuCount", 2)),
    Case("en-unknown-gpu-field", "EdgeNode", "unknown-field", _set("gpus.0.cores", 10752)),
]

#: metadata.name values both the manifest loader and the CRD reject.
BAD_NAMES = ["Worker-1", "worker_1", "-worker", "worker-", "w" * 64, "worker.1"]
