"""Model-pod manifests and the per-node reconcile plan (pure logic)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from lmedge.api import LMPlacement, Placement
from lmedge.api.manifests import load_resources
from lmedge.backends.kubernetes.pods import (
    ObservedPod,
    model_pod,
    placement_hash,
    plan_node,
)
from lmedge.operator.timeslicing import CONFIG_LABEL, node_labels, render_configmap

REPO = Path(__file__).parents[3]
EXAMPLES = REPO / "examples" / "testbed"
NODES, SERVICES = load_resources(EXAMPLES)
SVC = {s.name: s for s in SERVICES}
LMS = list(SVC)

GPU2 = LMPlacement(lm="lm4", mode="gpu", cpu_cores=2.5, vgpus=2)
CPU4 = LMPlacement(lm="lm1", mode="cpu", cpu_cores=4, vgpus=0)


def test_gpu_pod_resources_are_exact_and_requests_equal_limits() -> None:
    pod = model_pod(SVC["lm4"], GPU2, "worker-6", "ns", owner_uid="u-1")
    res = pod["spec"]["containers"][0]["resources"]
    assert (
        res["requests"]
        == res["limits"]
        == {
            "cpu": "2500m",
            "memory": "3584Mi",
            "nvidia.com/gpu": "2",
        }
    )
    assert pod["spec"]["nodeName"] == "worker-6"
    owner = pod["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("LMService", "lm4", "u-1")
    assert pod["metadata"]["labels"]["lmedge.io/lm"] == "lm4"


def test_cpu_pod_has_no_gpu_and_whole_cores() -> None:
    pod = model_pod(SVC["lm1"], CPU4, "worker-1", "ns")
    res = pod["spec"]["containers"][0]["resources"]["limits"]
    assert res == {"cpu": "4", "memory": "3072Mi"}
    assert "ownerReferences" not in pod["metadata"]


def test_names_are_stable_and_change_with_resources() -> None:
    a = model_pod(SVC["lm4"], GPU2, "worker-6", "ns")["metadata"]["name"]
    b = model_pod(SVC["lm4"], GPU2, "worker-6", "ns")["metadata"]["name"]
    c = model_pod(SVC["lm4"], GPU2.model_copy(update={"vgpus": 1}), "worker-6", "ns")
    assert a == b != c["metadata"]["name"]
    assert len(a) <= 63


def _pod(lm: str, p: LMPlacement, ready: bool = True, deleting: bool = False) -> ObservedPod:
    return ObservedPod(
        name=f"{lm}-{placement_hash(p)}",
        lm=lm,
        node="worker-6",
        placement_hash=placement_hash(p),
        phase="Running",
        ready=ready,
        deleting=deleting,
    )


def _placement(*lms: LMPlacement) -> Placement:
    return Placement(node="worker-6", lms=list(lms))


@pytest.mark.parametrize(
    ("desired", "observed", "create", "delete", "voided"),
    [
        (_placement(GPU2), [], ["lm4"], [], []),
        (_placement(GPU2), [_pod("lm4", GPU2)], [], [], []),
        (_placement(), [_pod("lm4", GPU2)], [], ["lm4-" + placement_hash(GPU2)], []),
        (
            _placement(GPU2.model_copy(update={"vgpus": 1})),
            [_pod("lm4", GPU2)],
            ["lm4"],
            ["lm4-" + placement_hash(GPU2)],
            [],
        ),
        (
            _placement(GPU2, CPU4.model_copy(update={"lm": "lm2"})),
            [_pod("lm4", GPU2, ready=False)],
            [],
            [],
            ["lm2"],
        ),
        (
            _placement(CPU4.model_copy(update={"lm": "lm2"})),
            [_pod("lm4", GPU2, ready=False)],
            ["lm2"],
            ["lm4-" + placement_hash(GPU2)],
            [],
        ),
        (_placement(GPU2), [_pod("lm4", GPU2, deleting=True)], ["lm4"], [], []),
    ],
    ids=[
        "create-missing",
        "idempotent",
        "delete-off",
        "resize-recreates",
        "pending-voids-creation",
        "deleting-the-pending-pod-lifts-the-rule",
        "ignores-terminating",
    ],
)
def test_plan_node(
    desired: Placement,
    observed: list[ObservedPod],
    create: list[str],
    delete: list[str],
    voided: list[str],
) -> None:
    actions = plan_node(desired, observed, LMS)
    assert [p.lm for p in actions.create] == create
    assert actions.delete == delete
    assert actions.voided == voided


def test_duplicate_pods_for_one_lm_keep_the_ready_one() -> None:
    ready = _pod("lm4", GPU2)
    dup = ObservedPod("lm4-dup", "lm4", "worker-6", placement_hash(GPU2), "Running", False)
    actions = plan_node(_placement(GPU2), [dup, ready], LMS)
    assert actions.delete == ["lm4-dup"]
    assert actions.create == []


def test_timeslicing_configmap_has_one_key_per_replica_count() -> None:
    cm = render_configmap(NODES, "lmedge-time-slicing", "gpu-operator")
    assert list(cm["data"]) == ["lmedge-replicas-2"]
    cfg = yaml.safe_load(cm["data"]["lmedge-replicas-2"])
    assert cfg["sharing"]["timeSlicing"]["resources"] == [{"name": "nvidia.com/gpu", "replicas": 2}]


def test_node_labels_select_the_config_only_on_gpu_nodes() -> None:
    by_name = {n.name: n for n in NODES}
    assert node_labels(by_name["worker-6"])[CONFIG_LABEL] == "lmedge-replicas-2"
    assert node_labels(by_name["worker-1"])[CONFIG_LABEL] is None


def _entrypoint_args() -> list[str]:
    """The `lmedge ...` command images/model-server/entrypoint.sh execs, before "$@"."""
    import shlex

    script = (REPO / "images" / "model-server" / "entrypoint.sh").read_text()
    command = script.split("exec ", 1)[1].replace("\\\n", " ")
    words = shlex.split(command.split('"$@"', 1)[0])
    assert words[0] == "lmedge"
    env = {"LMEDGE_LM": "lm1", "LMEDGE_MODALITY": "text-to-text", "LMEDGE_BACKEND": "stub"}
    return [env.get(w[2:-1], w) if w.startswith("${") else w for w in words[1:]]


def test_model_pod_args_are_flags_for_the_images_entrypoint() -> None:
    # The image's entrypoint already runs `lmedge model-server ...`; the pod's
    # args are appended to it ("$@") and must parse there.
    import typer

    from lmedge.cli import dataplane

    app = typer.Typer()
    app.callback()(lambda: None)
    dataplane.register(app)
    command = typer.main.get_command(app).commands["model-server"]  # type: ignore[attr-defined]
    pod = model_pod(SVC["lm4"], GPU2, "worker-6", "ns", owner_uid="u-1")
    (container,) = pod["spec"]["containers"]
    name, *base = _entrypoint_args()
    ctx = command.make_context(name, [*base, *container["args"]])
    assert ctx.params["lm"] == "lm4"  # the LMService's name wins over the image's default
    assert ctx.params["device"] == "cuda"
    assert ctx.params["modality"] == "text-to-image"
    assert "command" not in container


def test_model_pod_is_what_the_node_agent_policy_admits() -> None:
    # The admission policy's rules, on the manifest (the real policy runs in
    # tests/integration/test_admission.py).
    pod = model_pod(SVC["lm4"], GPU2, "worker-6", "ns", owner_uid="u-1", service_account="sa")
    spec = pod["spec"]
    assert spec["serviceAccountName"] == "sa"
    assert spec["automountServiceAccountToken"] is False
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] == 10001
    assert spec["volumes"] == [
        {
            "name": "progress",
            "hostPath": {"path": "/var/lib/lmedge/progress/lm4", "type": "DirectoryOrCreate"},
        }
    ]
    (container,) = spec["containers"]
    # Mounted where the image's entrypoint keeps progress.
    assert container["volumeMounts"] == [
        {"name": "progress", "mountPath": "/var/lib/lmedge/progress"}
    ]
    assert "--progress-dir /var/lib/lmedge/progress" in " ".join(_entrypoint_args())
    assert "serviceAccountName" not in model_pod(SVC["lm4"], GPU2, "w", "ns")["spec"]
