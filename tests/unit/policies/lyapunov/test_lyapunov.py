"""The Lyapunov deployer: table-driven cases on the paper's testbed, plus a brute-force
cross-check of the optimum against an independent implementation of the score."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from lmedge.api import (
    ClusterContext,
    LMPlacement,
    NodeInfo,
    NodeObservation,
    Placement,
    ServiceInfo,
    check_placement,
)
from lmedge.errors import ConfigError
from lmedge.policies.lyapunov import LyapunovParams, build, default_alphas
from lmedge.policies.lyapunov.deployer import _Scorer, paper_alpha
from tests.unit.policies.lyapunov.scenario import node_obs, paper_testbed


def modes(p: Placement) -> dict[str, str]:
    return {x.lm: x.mode for x in p.lms}


def test_default_alphas_are_the_papers_calibrated_weights() -> None:
    gpu, cpu = default_alphas(paper_testbed().services, 30.0)
    assert [gpu[f"lm{i}"] for i in range(1, 5)] == [5.80, 7.20, 5.61, 3.02]
    assert [cpu[f"lm{i}"] for i in range(1, 5)] == [3.68, 1.00, 0.0, 0.0]


def test_default_alphas_do_not_follow_the_service_times() -> None:
    """alpha is a policy parameter: changing the physical profile leaves it alone."""
    ctx = paper_testbed()
    faster = [
        s.model_copy(
            update={
                "spec": s.spec.model_copy(
                    update={
                        "profile": s.spec.profile.model_copy(update={"gpu_seconds_per_prompt": 0.1})
                    }
                )
            }
        )
        for s in ctx.services
    ]
    assert default_alphas(faster, 30.0) == default_alphas(ctx.services, 30.0)
    gpu, _ = default_alphas(faster, 30.0, "profile")
    assert gpu == {f"lm{i}": pytest.approx(300.0) for i in range(1, 5)}


def test_paper_alphas_rescale_to_the_slot_length() -> None:
    gpu, cpu = default_alphas(paper_testbed().services, 15.0)
    assert gpu["lm4"] == pytest.approx(1.51) and cpu["lm1"] == pytest.approx(1.84)


@pytest.mark.parametrize(
    ("model", "modality", "runs_on", "expected"),
    [
        ("openai-community/GPT2-Large", "text-to-text", "cpu-or-gpu", (7.20, 1.00)),
        ("runwayml/stable-diffusion-v1-5", "text-to-image", "gpu-only", (3.02, 0.0)),
        ("tinyllama", "text-to-text", "cpu-or-gpu", (5.80, 3.68)),
        ("tinyllama", "text-to-text", "gpu-only", (5.80, 0.0)),
        ("llava", "image-to-text", "gpu-only", (5.61, 0.0)),
        ("llava", "image-to-text", "cpu-or-gpu", (5.61, 1.00)),
        ("sdxl-turbo", "image-to-image", "gpu-only", (3.02, 0.0)),
        ("whisper", "audio-to-text", "cpu-or-gpu", (5.80, 3.68)),
    ],
)
def test_paper_alpha_of_other_models_follows_their_modality_class(
    model: str, modality: str, runs_on: str, expected: tuple[float, float]
) -> None:
    base = paper_testbed().service("lm1").spec
    spec = base.model_copy(update={"model": model, "modality": modality, "runs_on": runs_on})
    assert paper_alpha(spec) == expected


def test_alpha_overrides_by_lm_name_win_over_the_default() -> None:
    params = LyapunovParams(alpha_gpu={"lm4": 9.0})
    obs = node_obs("worker-2", {"lm1": 1, "lm4": 1})
    # The override replaces lm4's weight only; the others keep the paper's.
    scorer = _Scorer(params, obs)
    names = [s.name for s in obs.services]
    assert scorer.alpha_gpu[names.index("lm4")] == 9.0
    assert scorer.alpha_gpu[names.index("lm1")] == 5.80


ACTION = {"utilization": "action"}
OFF4 = {"lm1": "off", "lm2": "off", "lm3": "off", "lm4": "off"}
BUSY_GPU = (0.9, 0.2, 0.3)
IDLE = (0.0, 0.0, 0.0)

# id, node, backlog, running, measured util, params, expected modes
CASES: list[
    tuple[
        str,
        str,
        dict[str, int],
        dict[str, str],
        tuple[float, float, float],
        dict[str, Any],
        dict[str, str],
    ]
] = [
    ("idle-stays-off", "worker-2", {}, {}, IDLE, {}, OFF4),
    ("lm4-backlog", "worker-2", {"lm4": 10}, {}, IDLE, {}, OFF4 | {"lm4": "gpu"}),
    (
        "two-vgpus-go-to-the-largest-gpu-gains",
        "worker-2",
        {"lm1": 10, "lm2": 10, "lm3": 10, "lm4": 10},
        {},
        IDLE,
        {},
        {"lm1": "cpu", "lm2": "gpu", "lm3": "gpu", "lm4": "off"},
    ),
    (
        "a-deep-lm4-queue-wins-a-vgpu",
        "worker-2",
        {"lm1": 10, "lm2": 10, "lm3": 10, "lm4": 60},
        {},
        IDLE,
        {},
        {"lm1": "cpu", "lm2": "gpu", "lm3": "off", "lm4": "gpu"},
    ),
    (
        # Action-induced eta: two pods on one time-sliced GPU split it, so LM4 takes it alone.
        "action-eta-deep-lm4-queue-takes-the-gpu-alone",
        "worker-2",
        {"lm1": 10, "lm2": 10, "lm3": 10, "lm4": 60},
        {},
        IDLE,
        ACTION,
        {"lm1": "cpu", "lm2": "cpu", "lm3": "off", "lm4": "gpu"},
    ),
    (
        "cpu-only-node-never-places-gpu-only-lms",
        "worker-1",
        {"lm1": 5, "lm2": 5, "lm3": 50, "lm4": 50},
        {},
        IDLE,
        {},
        {"lm1": "cpu", "lm2": "cpu", "lm3": "off", "lm4": "off"},
    ),
    (
        "running-without-backlog-is-kept-on-cpu-not-churned",
        "worker-2",
        {},
        {"lm1": "cpu"},
        BUSY_GPU,
        {},
        OFF4 | {"lm1": "cpu"},
    ),
    (
        "idle-gpu-only-lm-kept-while-the-gpu-is-cheap",
        "worker-2",
        {},
        {"lm3": "gpu"},
        IDLE,
        {},
        OFF4 | {"lm3": "gpu"},
    ),
    (
        "idle-gpu-only-lm-stopped-when-its-vgpu-costs-more-than-churn",
        "worker-2",
        {},
        {"lm3": "gpu"},
        BUSY_GPU,
        {},
        OFF4,
    ),
    ("action-eta-idle-gpu-only-lm-stopped", "worker-2", {}, {"lm3": "gpu"}, IDLE, ACTION, OFF4),
    ("control-node-hosts-nothing", "control", {"lm1": 9}, {}, IDLE, {}, OFF4),
]


@pytest.mark.parametrize(
    ("node", "backlog", "running", "util", "params", "expected"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_placement_cases(
    node: str,
    backlog: dict[str, int],
    running: dict[str, str],
    util: tuple[float, float, float],
    params: dict[str, Any],
    expected: dict[str, str],
) -> None:
    obs = node_obs(node, backlog, running, util=util)
    decision = build(paper_testbed(), 0, params).place(obs)
    assert decision.source == "rule" and decision.policy == "lyapunov" and decision.node == node
    assert modes(decision.value) == expected
    assert check_placement(decision.value, obs.node, obs.services) == []


def reference_score(p: LyapunovParams, obs: NodeObservation, action: list[LMPlacement]) -> float:
    """Independent transcription of the README formula."""
    spec = obs.node.spec
    gpu_a, cpu_a = default_alphas(obs.services, obs.slot_s)
    q = {s.name: obs.state.backlog.get(s.name, 0) for s in obs.services}
    mem = {s.name: s.spec.deployment_memory_gib for s in obs.services}
    was = {i.lm for i in obs.state.instances}
    n_gpu = sum(a.vgpus for a in action)
    if p.utilization == "observed":
        st = obs.state
        eta_g, eta_c, eta_m = st.gpu_util, st.cpu_util, 1 - st.free_memory_gib / spec.memory_gib
    else:
        eta_g = n_gpu / spec.total_vgpus if spec.total_vgpus else 0.0
        eta_c = sum(a.cpu_cores for a in action) / spec.cpu_cores
        eta_m = sum(mem[a.lm] for a in action if a.mode != "off") / spec.memory_gib
    f_g = 1 / (1 + (spec.vgpus_per_gpu - 1) * eta_g)
    f_c = 1 / (1 + p.cpu_contention * eta_c) / (1 + p.cpu_contention * eta_m)
    total = 0.0
    for a in action:
        if a.mode == "gpu":
            total += q[a.lm] * gpu_a[a.lm] * a.vgpus**p.vgpu_speedup * f_g
        elif a.mode == "cpu":
            total += q[a.lm] * cpu_a[a.lm] * f_c
        if (a.mode != "off") != (a.lm in was):
            total -= p.v * p.lambda_churn * (1 + p.kappa * q[a.lm])
    return total - p.v * (p.p0 + p.p1 * eta_g + p.p2 * eta_g**2) * n_gpu


def all_actions(node: NodeInfo, services: list[ServiceInfo]) -> list[list[LMPlacement]]:
    per_lm = []
    for s in services:
        opts = [LMPlacement(lm=s.name, mode="off", cpu_cores=0, vgpus=0)]
        opts.append(LMPlacement(lm=s.name, mode="cpu", cpu_cores=4, vgpus=0))
        opts += [LMPlacement(lm=s.name, mode="gpu", cpu_cores=4, vgpus=v) for v in (1, 2)]
        per_lm.append(opts)
    out = []
    for combo in itertools.product(*per_lm):
        if not check_placement(Placement(node=node.name, lms=list(combo)), node, services):
            out.append(list(combo))
    return out


BRUTE = [
    ("w6-mixed", "worker-6", {"lm1": 3, "lm2": 8, "lm3": 1, "lm4": 7}, {"lm2": "cpu"}, {}),
    (
        "w6-speedup",
        "worker-6",
        {"lm1": 3, "lm2": 8, "lm3": 20, "lm4": 7},
        {},
        {"vgpu_speedup": 0.7},
    ),
    (
        "w3-pricey",
        "worker-3",
        {"lm1": 2, "lm3": 2},
        {"lm4": "gpu"},
        {"p0": 3.0, "lambda_churn": 2.0},
    ),
    ("w1-cpu", "worker-1", {"lm1": 30, "lm2": 1}, {"lm2": "cpu"}, {"cpu_contention": 2.0}),
    (
        "w2-local-search",
        "worker-2",
        {"lm1": 4, "lm2": 9, "lm3": 6, "lm4": 12},
        {"lm1": "gpu"},
        {"max_enumeration": 1},
    ),
]


UTILS = [("action", IDLE), ("observed", IDLE), ("observed", (0.6, 0.5, 0.4))]


@pytest.mark.parametrize(
    ("node", "backlog", "running", "params", "eta", "util"),
    [b[1:] + u for b in BRUTE for u in UTILS],
    ids=[f"{b[0]}-{u[0]}-{u[1][0]}" for b in BRUTE for u in UTILS],
)
def test_matches_brute_force_optimum(
    node: str,
    backlog: dict[str, int],
    running: dict[str, str],
    params: dict[str, Any],
    eta: str,
    util: tuple[float, float, float],
) -> None:
    ctx: ClusterContext = paper_testbed()
    obs = node_obs(node, backlog, running, util=util)
    params = params | {"utilization": eta}
    p = LyapunovParams(**params)
    chosen = build(ctx, 0, params).place(obs).value
    best = max(reference_score(p, obs, a) for a in all_actions(obs.node, obs.services))
    assert reference_score(p, obs, chosen.lms) == pytest.approx(best, abs=1e-9)


def test_many_lms_use_local_search_and_stay_feasible() -> None:
    base = paper_testbed()
    clones = []
    for k in range(16):
        s = base.services[k % 4]
        clones.append(ServiceInfo(name=f"m{k}", spec=s.spec))
    ctx = ClusterContext(nodes=base.nodes, services=clones)
    obs = node_obs("worker-6", {f"m{k}": k + 1 for k in range(16)}, ctx=ctx)
    placement = build(ctx, 0, {}).place(obs).value
    assert check_placement(placement, obs.node, obs.services) == []
    assert sum(1 for p in placement.lms if p.mode != "off") == 4  # 16 cores / 4 cores each


@pytest.mark.parametrize(
    "params",
    [{"v": -1}, {"gamma": 1.0}, {"alpha_gpu": {"lm1": "fast"}}, {"vgpu_speedup": 2}],
    ids=["negative-v", "unknown-key", "bad-alpha", "speedup-above-one"],
)
def test_bad_params_are_rejected_loudly(params: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match="invalid parameters for lyapunov"):
        build(paper_testbed(), 0, params)


def test_alpha_override_changes_the_choice() -> None:
    obs = node_obs("worker-2", {"lm1": 10, "lm2": 10, "lm3": 10, "lm4": 10})
    boosted = build(paper_testbed(), 0, {"alpha_gpu": {"lm4": 40.0}}).place(obs).value
    assert modes(boosted)["lm4"] == "gpu"
