"""The one hostability rule (`lmedge.api.hosting`, `ClusterContext.modes`), case by case.

Each case is one (node, LM) of the conftest cluster, or of an LM changed in
one way, with the modes expected (fastest first) and, when a mode is shut,
the sentence `refusal` gives for it.
"""

from __future__ import annotations

import pytest

from lmedge.api import ClusterContext, EdgeNodeSpec, LMServiceSpec, NodeInfo, ServiceInfo
from lmedge.api.hosting import modes, refusal
from tests.unit.api.conftest import NODES, SERVICES, node

BY_NAME = {s.name: s for s in SERVICES}


def with_cpu_seconds(sv: ServiceInfo, name: str, cpu_s: float | None) -> ServiceInfo:
    """`sv` renamed, with another CPU time per prompt.

    None makes the LM the schema rejects (cpu-or-gpu needs a CPU profile), so
    it is built unvalidated: no manifest path reaches it, but every layer must
    still agree on it (it is the case where they once did not).
    """
    profile = sv.spec.profile.model_copy(update={"cpu_seconds_per_prompt": cpu_s})
    spec = sv.spec.model_copy(update={"profile": profile})
    return ServiceInfo.model_construct(name=name, spec=spec)


NOPROF = with_cpu_seconds(BY_NAME["txt"], "noprof", None)
#: CPU faster than GPU by its profile (1 s against 5 s): CPU comes first.
CPUFAST = with_cpu_seconds(BY_NAME["txt"], "cpufast", 1.0)
#: A node with fewer cores than the LMs' default 4 (but above their minCpuCores).
FEW = NodeInfo(
    name="few",
    spec=EdgeNodeSpec.model_validate(
        {"cpuCores": 2, "memoryGib": 24, "gpus": [{"vramGib": 24}], "vgpusPerGpu": 2}
    ),
)
SVCS = [*SERVICES, NOPROF, CPUFAST]
CTX = ClusterContext(nodes=[*NODES, FEW], services=SVCS)

CASES: list[tuple[str, str, tuple[str, ...], dict[str, str]]] = [
    ("cpu", "txt", ("cpu",), {"gpu": "cpu has no GPU; txt cannot run in gpu mode"}),
    ("gpu", "txt", ("gpu", "cpu"), {}),
    ("cpu", "img", (), {"cpu": "img runs on GPU only; mode cpu is not allowed"}),
    ("gpu", "img", ("gpu",), {}),
    ("control", "txt", (), {"gpu": "control is a control node and hosts no LMs"}),
    ("small", "big", (), {"cpu": "big needs 9 GiB memory; small has 8"}),
    ("vram", "gen", (), {"gpu": "gen needs 6 GiB vRAM in gpu mode; vram has 4"}),
    ("vram", "big", ("gpu", "cpu"), {}),
    (
        "cpu",
        "noprof",
        (),
        {"cpu": "noprof has no CPU profile (cpuSecondsPerPrompt); mode cpu is not allowed"},
    ),
    ("gpu", "noprof", ("gpu",), {}),
    ("gpu", "cpufast", ("cpu", "gpu"), {}),
    ("few", "txt", ("gpu", "cpu"), {}),
]


@pytest.mark.parametrize(
    ("node", "lm", "want", "why"),
    CASES,
    ids=[
        "text-on-cpu-node",
        "text-on-gpu-node",
        "gpu-only-on-cpu-node",
        "gpu-only-on-gpu-node",
        "control-node",
        "memory-too-small",
        "vram-too-small",
        "vram-fits",
        "cpu-or-gpu-without-cpu-profile-on-cpu-node",
        "cpu-or-gpu-without-cpu-profile-on-gpu-node",
        "cpu-faster-comes-first",
        "fewer-cores-than-the-default-but-the-minimum",
    ],
)
def test_modes(node: str, lm: str, want: tuple[str, ...], why: dict[str, str]) -> None:
    n, s = CTX.node(node), CTX.service(lm)
    assert modes(n.spec, s.spec) == want
    assert CTX.modes(node, lm) == want
    assert CTX.modes(node, lm) is CTX.modes(node, lm)  # kept, not recomputed
    assert CTX.can_host(node, lm) == bool(want)
    assert (node in CTX.feasible_nodes(lm)) == bool(want)
    for mode in ("gpu", "cpu"):
        assert (refusal(n, s, mode) == "") == (mode in want)
        if why.get(mode):
            assert refusal(n, s, mode) == why[mode]
    assert refusal(n, s, "off") == ""


def test_room_false_leaves_out_only_memory_cores_and_vram() -> None:
    small, vram = CTX.node("small"), CTX.node("vram")
    assert refusal(small, CTX.service("big"), "cpu", room=False) == ""
    assert refusal(vram, CTX.service("gen"), "gpu", room=False) == ""
    assert refusal(CTX.node("cpu"), NOPROF, "cpu", room=False) != ""
    assert refusal(CTX.node("cpu"), CTX.service("img"), "cpu", room=False) != ""


def test_an_unknown_name_is_a_key_error() -> None:
    with pytest.raises(KeyError):
        CTX.modes("nowhere", "txt")
    with pytest.raises(KeyError):
        CTX.modes("cpu", "nothing")


def _engine_lm(name: str, vram: float, gpus: list[dict[str, object]]) -> ServiceInfo:
    """A llama.cpp LM of 13.5 GiB weights (a 7B model at 16 bits) holding `vram` GiB a pod."""
    decode = [{"running": 1, "tokensPerS": 30}, {"running": 8, "tokensPerS": 160}]
    spec = {
        "model": name,
        "modality": "text-to-text",
        "image": f"example/{name}:1",
        "deploymentMemoryGib": 4,
        "minMemoryGib": 2,
        "minVramGib": vram,
        "runsOn": "gpu-only",
        "engine": {
            "kind": "llama.cpp",
            "tokens": {
                "weightsGib": 13.5,
                "kvBytesPerToken": 524288,
                "contextTokens": 2048,
                "gpus": [{**g, "prefillTokensPerS": 2000, "decode": decode} for g in gpus],
            },
        },
    }
    return ServiceInfo(name=name, spec=LMServiceSpec.model_validate(spec))


#: Weights and a 2.5-GiB KV pool need 16 GiB of vRAM: more than a 12-GiB GPU has.
SEVEN_B = _engine_lm("seven-b", 16.0, [{"gpuModel": "*"}])
#: Profiled on one GPU model only: no other GPU can serve it at a known rate.
ONLY_A100 = _engine_lm("only-a100", 16.0, [{"gpuModel": "NVIDIA-A100"}])
TWELVE = node("twelve", cpuCores=16, memoryGib=32, gpus=[{"vramGib": 12}], vgpusPerGpu=2)
A100 = node("a100", cpuCores=16, memoryGib=64, gpus=[{"model": "NVIDIA-A100", "vramGib": 40}])
ENGINE_CTX = ClusterContext(nodes=[*NODES, TWELVE, A100], services=[SEVEN_B, ONLY_A100])


@pytest.mark.parametrize(
    ("node_name", "lm", "want", "why"),
    [
        ("gpu", "seven-b", ("gpu",), ""),
        ("twelve", "seven-b", (), "seven-b needs 16 GiB vRAM in gpu mode; twelve has 12"),
        ("a100", "only-a100", ("gpu",), ""),
        (
            "gpu",
            "only-a100",
            (),
            "only-a100 cannot run in gpu mode on gpu: "
            "no token profile for GPU model generic and no * entry",
        ),
    ],
    ids=["kv-fits", "weights-and-kv-exceed-vram", "profiled-gpu", "unprofiled-gpu"],
)
def test_a_token_engine_is_hostable_only_where_its_weights_kv_and_profile_fit(
    node_name: str, lm: str, want: tuple[str, ...], why: str
) -> None:
    n, s = ENGINE_CTX.node(node_name), ENGINE_CTX.service(lm)
    assert ENGINE_CTX.modes(node_name, lm) == want
    assert refusal(n, s, "gpu") == why
    # A missing profile shuts the mode whatever the room; memory is a room clause.
    assert (refusal(n, s, "gpu", room=False) != "") == ("profile" in why)
