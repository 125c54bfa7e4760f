"""The engine of an LM service: pipeline by default, token profiles validated, capacity helpers."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from lmedge.api.engines import (
    NOMINAL_INPUT_TOKENS,
    NOMINAL_OUTPUT_TOKENS,
    fits,
    kv_capacity_tokens,
    throughput_profile,
)
from lmedge.api.manifests import load_resources, to_manifest
from lmedge.api.resources import EdgeNodeSpec, LMServiceSpec
from lmedge.errors import ManifestError
from tests.unit.api.crd_cases import EDGENODE, LMSERVICE, TOKEN_LMSERVICE


def token_spec(**tokens: Any) -> dict[str, Any]:
    spec = copy.deepcopy(TOKEN_LMSERVICE)
    spec["engine"]["tokens"].update(tokens)
    return spec


def node(gpus: list[dict[str, Any]], memory_gib: float = 24) -> EdgeNodeSpec:
    return EdgeNodeSpec.model_validate({**EDGENODE, "gpus": gpus, "memoryGib": memory_gib})


def test_a_manifest_without_engine_is_a_pipeline_and_unchanged() -> None:
    spec = LMServiceSpec.model_validate(LMSERVICE)
    assert (spec.engine.kind, spec.engine.tokens) == ("pipeline", None)
    assert spec.profile.gpu_seconds_per_prompt == 5.17
    assert kv_capacity_tokens(spec, "gpu") == 0
    assert fits(spec, node([]), "gpu") is None


def test_decode_curve_is_piecewise_linear_and_flat_after_the_last_point() -> None:
    gpu = LMServiceSpec.model_validate(TOKEN_LMSERVICE).engine.tokens.gpus[0]  # type: ignore[union-attr]
    # points (1, 90), (16, 1000), (64, 2000)
    assert [gpu.decode_tokens_per_s(n) for n in (1, 16, 64, 500)] == [90, 1000, 2000, 2000]
    assert gpu.decode_tokens_per_s(40) == pytest.approx(1500)
    assert gpu.decode_tokens_per_s(6) == pytest.approx(90 + 5 / 15 * 910)


def test_decode_points_may_come_in_any_order() -> None:
    spec = token_spec()
    spec["engine"]["tokens"]["gpus"][0]["decode"].reverse()
    gpu = LMServiceSpec.model_validate(spec).engine.tokens.gpus[0]  # type: ignore[union-attr]
    assert [p.running for p in gpu.decode] == [1, 16, 64]


def test_kv_capacity_is_the_reservation_after_the_weights_unless_given() -> None:
    spec = LMServiceSpec.model_validate(TOKEN_LMSERVICE)  # 6 GiB vRAM, 8 GiB memory, 2.5 weights
    assert kv_capacity_tokens(spec, "gpu") == 3.5 * 2**30 // 32768
    assert kv_capacity_tokens(spec, "cpu") == 5.5 * 2**30 // 32768
    given = LMServiceSpec.model_validate(token_spec(kvCacheGib=1.0))
    assert kv_capacity_tokens(given, "gpu") == kv_capacity_tokens(given, "cpu") == 32768


def test_the_profile_is_derived_from_the_tokens_when_absent() -> None:
    spec = LMServiceSpec.model_validate(token_spec(maxRunningSequences=16))
    # GPU: first entry, R = min(16, pool / 285) = 16: 215 / 1000 + 70 / 4000
    assert spec.profile.gpu_seconds_per_prompt == pytest.approx(
        NOMINAL_OUTPUT_TOKENS / 1000 + NOMINAL_INPUT_TOKENS / 4000
    )
    # CPU: R = 16 is past the last point (8, 40): 215 / 40 + 70 / 150
    assert spec.profile.cpu_seconds_per_prompt == pytest.approx(215 / 40 + 70 / 150)
    # a profile given wins (per-prompt policies plan with a measured figure)
    given = {**TOKEN_LMSERVICE, "profile": {"gpuSecondsPerPrompt": 2.0, "cpuSecondsPerPrompt": 9}}
    assert LMServiceSpec.model_validate(given).profile.gpu_seconds_per_prompt == 2.0


def test_a_kv_limited_batch_costs_more_per_prompt() -> None:
    # a pool of 16 x 285 tokens: R = 16 on GPU whatever maxRunningSequences allows
    tight = token_spec(kvCacheGib=16 * 285 * 32768 / 2**30, contextTokens=285)
    spec = LMServiceSpec.model_validate(tight)
    assert spec.profile.gpu_seconds_per_prompt == pytest.approx(215 / 1000 + 70 / 4000)


@pytest.mark.parametrize(
    ("gpus", "expected"),
    [
        ([{"model": "NVIDIA-RTX-3090", "vramGib": 24}], 4000),
        ([{"model": "NVIDIA-A5000", "vramGib": 24}], 2500),
        ([{"vramGib": 24}], 2500),
    ],
    ids=["own-entry", "fallback", "generic"],
)
def test_throughput_profile_by_gpu_model(gpus: list[dict[str, Any]], expected: float) -> None:
    spec = LMServiceSpec.model_validate(TOKEN_LMSERVICE)
    prof = throughput_profile(spec, node(gpus), "gpu")
    assert prof is not None and prof.prefill_tokens_per_s == expected
    assert throughput_profile(spec, node(gpus), "cpu") == spec.engine.tokens.cpu  # type: ignore[union-attr]
    assert throughput_profile(spec, node([]), "gpu") is None


SEVEN_B: dict[str, Any] = {
    **TOKEN_LMSERVICE,
    "model": "llama-2-7b",
    "minVramGib": 16.0,
    "deploymentMemoryGib": 20.0,
    "runsOn": "gpu-only",
    "engine": {
        "kind": "vllm",
        "tokens": {
            "weightsGib": 13.5,
            "kvBytesPerToken": 524288,  # 2 x 32 layers x 4096 x 2 bytes
            "contextTokens": 4096,  # 2 GiB
            "gpus": [
                {
                    "gpuModel": "*",
                    "prefillTokensPerS": 3000,
                    "decode": [{"running": 1, "tokensPerS": 30}],
                }
            ],
        },
    },
}


@pytest.mark.parametrize(
    ("spec", "gpus", "memory", "mode", "reason"),
    [
        (SEVEN_B, [{"vramGib": 24}], 24, "gpu", None),
        (
            SEVEN_B,
            [{"vramGib": 12}],
            24,
            "gpu",
            "weights 13.5 GiB + KV cache 2.5 GiB exceed the node's 12 GiB vRAM",
        ),
        (TOKEN_LMSERVICE, [{"vramGib": 24}], 24, "cpu", None),
        (
            TOKEN_LMSERVICE,
            [{"vramGib": 24}],
            6,
            "cpu",
            "weights 2.5 GiB + KV cache 5.5 GiB exceed the node's 6 GiB memory",
        ),
        (
            {
                **TOKEN_LMSERVICE,
                "engine": {
                    **TOKEN_LMSERVICE["engine"],
                    "tokens": {
                        **TOKEN_LMSERVICE["engine"]["tokens"],
                        "gpus": TOKEN_LMSERVICE["engine"]["tokens"]["gpus"][:1],
                    },
                },
            },
            [{"model": "NVIDIA-A5000", "vramGib": 24}],
            24,
            "gpu",
            "no token profile for GPU model NVIDIA-A5000 and no * entry",
        ),
    ],
    ids=["7b-on-24gib", "7b-on-12gib", "cpu", "cpu-too-little-memory", "no-gpu-profile"],
)
def test_fits(
    spec: dict[str, Any], gpus: list[dict[str, Any]], memory: float, mode: Any, reason: str | None
) -> None:
    assert fits(LMServiceSpec.model_validate(spec), node(gpus, memory), mode) == reason


def test_a_7b_model_whose_kv_cache_does_not_fit_is_refused() -> None:
    small = {**SEVEN_B, "minVramGib": 14.0}  # 0.5 GiB after the weights: not one 2 GiB context
    with pytest.raises(
        ValueError, match=r"the KV pool within minVramGib .* must hold one contextTokens"
    ):
        LMServiceSpec.model_validate(small)


def write(path: Path, spec: dict[str, Any]) -> Path:
    doc = {
        "apiVersion": "lmedge.io/v1alpha1",
        "kind": "LMService",
        "metadata": {"name": "lm"},
        "spec": spec,
    }
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _edit(path: str, value: Any) -> dict[str, Any]:
    spec = copy.deepcopy(TOKEN_LMSERVICE)
    *parents, last = path.split(".")
    cur: Any = spec
    for p in parents:
        cur = cur[int(p)] if isinstance(cur, list) else cur[p]
    cur[last] = value
    return spec


@pytest.mark.parametrize(
    ("spec", "field", "message"),
    [
        (_edit("engine.kind", "tgi"), "spec.engine.kind", "Input should be"),
        (
            _edit("engine.tokens.kvBytesPerToken", 0),
            "spec.engine.tokens.kvBytesPerToken",
            "greater than or equal to 1",
        ),
        (
            _edit("engine.tokens.gpus.0.decode.0.running", 2),
            "spec.engine.tokens.gpus.0",
            "decode needs a point with running 1",
        ),
        (
            _edit("engine.tokens.gpus.0.decode.2.tokensPerS", 500),
            "spec.engine.tokens.gpus.0",
            "must not fall",
        ),
        (
            _edit("engine.tokens.gpus.1.gpuModel", "NVIDIA-RTX-3090"),
            "spec.engine.tokens",
            "more than once",
        ),
        (
            _edit("engine.tokens.kvCacheGib", 4),
            "spec",
            "weightsGib + kvCacheGib (6.5) must not exceed minVramGib (6)",
        ),
        (
            _edit("engine.kind", "pipeline"),
            "spec.engine",
            "engine.tokens is only for llama.cpp and vllm",
        ),
        (
            {**LMSERVICE, "engine": {"kind": "vllm"}},
            "spec.engine",
            "a vllm engine needs engine.tokens",
        ),
        (
            {k: v for k, v in LMSERVICE.items() if k != "profile"},
            "spec.profile",
            "a pipeline engine needs profile",
        ),
        (
            _edit("engine.tokens.cpu", None)
            | {
                "engine": {
                    "kind": "llama.cpp",
                    "tokens": {
                        k: v for k, v in TOKEN_LMSERVICE["engine"]["tokens"].items() if k != "cpu"
                    },
                }
            },
            "spec",
            "needs engine.tokens.cpu",
        ),
    ],
    ids=[
        "kind",
        "kv-bytes",
        "no-single",
        "falls",
        "duplicate-gpu",
        "kv-over-vram",
        "pipeline-tokens",
        "vllm-no-tokens",
        "no-profile",
        "no-cpu",
    ],
)
def test_the_loader_names_the_field(
    tmp_path: Path, spec: dict[str, Any], field: str, message: str
) -> None:
    with pytest.raises(ManifestError) as exc:
        load_resources(write(tmp_path / "lm.yaml", spec))
    assert exc.value.field == f"document 1: LMService/lm.{field}"
    assert message in exc.value.message


def test_a_token_engine_manifest_round_trips(tmp_path: Path) -> None:
    _, (svc,) = load_resources(write(tmp_path / "lm.yaml", TOKEN_LMSERVICE))
    again = tmp_path / "again.yaml"
    again.write_text(yaml.safe_dump(to_manifest("LMService", "lm", svc.spec)))
    _, (back,) = load_resources(again)
    assert back.spec == svc.spec
