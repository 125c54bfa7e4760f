"""The chart's in-cluster agent LLM (`agentLLM.enabled`), rendered by the real `helm`.

No cluster: `helm template` of the option and checks of what the manifests
guarantee -- a llama.cpp server with the model from a PVC or baked into the
image, optionally on a GPU node; the controller and node agents pointed at
it; a NetworkPolicy that admits only them; bad combinations refused with a
message.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.test_helm import CHART, by_kind, helm, helm_bin, pod_specs, template

__all__ = ["helm_bin"]  # the fixture, imported for this module

ON = ["--set", "agentLLM.enabled=true", "--set", "agentLLM.model.existingClaim=agent-models"]


def _env(spec: dict) -> dict[str, str]:
    return {e["name"]: e.get("value") for c in spec["containers"] for e in c.get("env", [])}


def test_off_by_default(helm_bin: Path) -> None:
    docs = template(helm_bin)
    assert not any("agent-llm" in d["metadata"]["name"] for d in docs)


def test_the_agents_are_pointed_at_the_in_chart_server(helm_bin: Path) -> None:
    docs = template(helm_bin, *ON, "--set", "agentLLM.model.name=qwen-3b")
    svc = by_kind(docs, "Service")["t-lmedge-agent-llm"]
    port = svc["spec"]["ports"][0]["port"]
    specs = pod_specs(docs)
    for name in ("t-lmedge-controller", "t-lmedge-node-agent"):
        env = _env(specs[name])
        assert (
            env["LMEDGE_LLM_BASE_URL"] == f"http://t-lmedge-agent-llm.lmedge-system.svc:{port}/v1"
        )
        assert env["LMEDGE_LLM_MODEL"] == "qwen-3b"
    server = specs["t-lmedge-agent-llm"]
    args = server["containers"][0]["args"]
    assert args[args.index("--alias") + 1] == "qwen-3b"
    # the model from the PVC, read-only, where --model looks for it
    claim = server["volumes"][0]["persistentVolumeClaim"]
    assert claim == {"claimName": "agent-models", "readOnly": True}
    mount = server["containers"][0]["volumeMounts"][0]
    assert args[args.index("--model") + 1].startswith(mount["mountPath"] + "/")
    assert "nvidia.com/gpu" not in server["containers"][0]["resources"].get("limits", {})


def test_only_the_controller_and_node_agents_reach_it(helm_bin: Path) -> None:
    docs = template(helm_bin, *ON, "--set", "networkPolicy.enabled=true")
    policy = by_kind(docs, "NetworkPolicy")["t-lmedge-agent-llm"]
    assert policy["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == (
        "agent-llm"
    )
    (rule,) = policy["spec"]["ingress"]
    components = {
        p["podSelector"]["matchLabels"]["app.kubernetes.io/component"] for p in rule["from"]
    }
    assert components == {"controller", "node-agent"}
    assert all("namespaceSelector" not in p for p in rule["from"]), "this namespace only"


def test_a_gpu_node_and_a_baked_model(helm_bin: Path) -> None:
    docs = template(
        helm_bin,
        "--set", "agentLLM.enabled=true", "--set", "agentLLM.model.baked=true",
        "--set", "agentLLM.gpu.enabled=true",
        "--set-string", "agentLLM.nodeSelector.nvidia\\.com/gpu\\.present=true",
    )  # fmt: skip
    server = pod_specs(docs)["t-lmedge-agent-llm"]
    c = server["containers"][0]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert "--n-gpu-layers" in c["args"]
    assert server["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert "volumes" not in server, "a baked model needs no volume"
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert server["securityContext"]["runAsNonRoot"] is True


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (["--set", "agentLLM.enabled=true"], "agentLLM.model.existingClaim"),
        ([*ON, "--set", "llm.baseUrl=http://x:8000/v1", "--set", "llm.apiKey=k"], "leave llm"),
        ([*ON, "--set", "agentLLM.model.path=/models/x.bin"], "path"),
    ],
    ids=["no-model", "two-endpoints", "not-gguf"],
)
def test_bad_values_are_refused_with_a_message(
    helm_bin: Path, values: list[str], message: str
) -> None:
    done = helm(helm_bin, "template", "t", str(CHART), *values, check=False)
    assert done.returncode != 0 and message in done.stderr, done.stderr


def test_the_agent_llm_image_serves_the_charts_arguments(helm_bin: Path, tmp_path: Path) -> None:
    """images/agent-llm's entrypoint (serve.py: llama-cpp-python's server) started with
    the container args the chart renders for a baked model: /health (the probes) and
    the OpenAI API answer, the model under the chart's name."""
    import subprocess
    import sys
    import time

    import httpx

    from lmedge.agents.local_llm import free_port, missing_reason, model_path

    if why := missing_reason():
        pytest.skip(why)
    port = free_port()
    docs = template(
        helm_bin,
        "--set", "agentLLM.enabled=true", "--set", "agentLLM.model.baked=true",
        "--set", "agentLLM.image=ghcr.io/lmedge/agent-llm:0.1.0",
        "--set", f"agentLLM.model.path={model_path()}", "--set", "agentLLM.model.name=gemma3-270m",
        "--set", "agentLLM.chatTemplate=chatml", "--set", f"agentLLM.port={port}",
        "--set", "agentLLM.contextSize=2048",
        "--set-json", 'agentLLM.extraArgs=["--threads","1"]',
    )  # fmt: skip
    (container,) = pod_specs(docs)["t-lmedge-agent-llm"]["containers"]
    serve = Path(__file__).resolve().parents[2] / "images" / "agent-llm" / "serve.py"
    log = tmp_path / "agent-llm.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, str(serve), *container["args"]], stdout=out, stderr=subprocess.STDOUT
        )
    try:
        deadline, health = time.monotonic() + 120, None
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except httpx.HTTPError:
                time.sleep(0.3)
        assert health is not None and health.status_code == 200, log.read_text()[-2000:]
        models = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=5).json()
        assert [m["id"] for m in models["data"]] == ["gemma3-270m"]
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_the_agent_llm_image_refuses_an_unknown_option() -> None:
    import subprocess
    import sys

    serve = Path(__file__).resolve().parents[2] / "images" / "agent-llm" / "serve.py"
    done = subprocess.run(
        [sys.executable, str(serve), "--model", "/m.gguf", "--flash-attn"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert "unrecognized arguments: --flash-attn" in done.stderr
