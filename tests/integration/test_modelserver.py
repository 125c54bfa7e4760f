"""The model server: resumable prompt sets across a SIGKILL, readiness, and the
transformers/diffusers backends on tiny models built here from configs with
random weights (never a hub download)."""

from __future__ import annotations

import base64
import concurrent.futures
import importlib.util
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from lmedge.api.inference import InferRequest, Prompt
from lmedge.dataplane.records import MemorySink
from lmedge.modelserver.app import ModelServer, create_app
from lmedge.modelserver.backends import StubBackend, load_backend, png_bytes
from lmedge.modelserver.progress import ProgressLog
from tests.fixtures.dataplane import TOKEN, ModelServerProcess, free_port, gateway

HAVE_TORCH = all(importlib.util.find_spec(m) for m in ("torch", "transformers", "diffusers"))
needs_torch = pytest.mark.skipif(
    not HAVE_TORCH,
    reason="torch/transformers/diffusers not installed: pip install -e '.[model-server]'",
)


def _prompts_run(url: str) -> float:
    text = httpx.get(url + "/metrics", timeout=5).text
    match = re.search(r'^lmedge_model_prompts_total\{lm="lm1"\} (\S+)$', text, re.M)
    return float(match.group(1)) if match else 0.0


def _finished(path: Path) -> int:
    if not path.exists():
        return 0
    return sum(1 for line in path.read_text().splitlines()[1:] if line.endswith("}"))


@pytest.mark.slow
def test_killed_pod_resumes_set_without_repeating_a_prompt(tmp_path: Path) -> None:
    """SIGKILL the pod mid-set; the gateway retries; the new pod runs only the rest."""
    pod = ModelServerProcess("lm1", tmp_path / "progress", seconds=0.3).start()
    _, server = gateway("worker-1", MemorySink(), models={"lm1": pod.url}, tau=60)
    progress = tmp_path / "progress" / "resume-1.jsonl"
    texts = [f"prompt {i}" for i in range(8)]
    try:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            pending = pool.submit(
                httpx.post,
                server.url + "/v1/prompt-sets",
                json={"id": "resume-1", "lm": "lm1", "prompts": [{"text": t} for t in texts]},
                headers={"Authorization": f"Bearer {TOKEN}"},
                timeout=60,
            )
            deadline = time.monotonic() + 20
            while _finished(progress) < 3 and time.monotonic() < deadline:
                time.sleep(0.02)
            pod.kill()
            done_before = _finished(progress)
            assert 3 <= done_before < 8
            pod.start()  # same port and progress directory, as a recreated pod
            response = pending.result(timeout=60)
        rerun = _prompts_run(pod.url)
    finally:
        server.stop()
        pod.stop()
    assert response.status_code == 200, response.text
    result = response.json()
    assert result["outcome"] == "success" and result["prompts_done"] == 8
    expected = [StubBackend("lm1", "text-to-text").run(Prompt(text=t)).text for t in texts]
    assert [o["text"] for o in result["outputs"]] == expected
    # Nothing repeated, nothing lost: the new process ran exactly the unfinished prompts.
    assert rerun == 8 - done_before
    assert not progress.exists()  # removed once the complete set was answered


def test_progress_log_ignores_torn_line_and_stale_file(tmp_path: Path) -> None:
    prompts = [Prompt(text="a"), Prompt(text="b"), Prompt(text="c")]
    log = ProgressLog(tmp_path, "s1", prompts)
    assert log.open() == {}
    log.record(0, StubBackend("lm1", "text-to-text").run(prompts[0]), 0.5)
    with log.path.open("a") as out:
        out.write('{"i": 1, "s": 0.4, "out": {"te')  # killed mid-write
    again = ProgressLog(tmp_path, "s1", prompts).open()
    assert sorted(again) == [0] and again[0].seconds == 0.5
    # The torn line is gone, so the next append is a clean line of its own.
    assert all(json.loads(line) for line in log.path.read_text().splitlines())
    other = ProgressLog(tmp_path, "s1", [Prompt(text="different")])
    assert other.open() == {}  # same id, other prompts: start afresh


def test_budget_stops_starting_prompts(tmp_path: Path) -> None:
    server = ModelServer("lm1", StubBackend("lm1", "text-to-text", seconds=0.1), tmp_path)
    server.load()
    request = InferRequest(
        id="b1", lm="lm1", prompts=[Prompt(text=str(i)) for i in range(10)], budget_s=0.25
    )
    result = server.run_set(request)
    assert not result.complete and 1 <= len(result.outputs) <= 4
    resumed = server.run_set(request.model_copy(update={"budget_s": None}))
    assert resumed.complete and resumed.resumed_from == len(result.outputs)


def test_readiness_and_wrong_lm(tmp_path: Path) -> None:
    server = ModelServer("lm1", StubBackend("lm1", "text-to-text"), tmp_path)
    with TestClient(create_app(server, load_in_background=False)) as client:
        assert client.get("/readyz").json()["status"] == "ready"
        body = {"id": "x", "lm": "lm2", "prompts": [{"text": "x"}]}
        response = client.post("/infer", json=body)
        assert response.status_code == 404 and "serves 'lm1'" in response.json()["detail"]


def test_unready_server_answers_503(tmp_path: Path) -> None:
    class Broken(StubBackend):
        def load(self) -> None:
            raise OSError("weights missing")

    server = ModelServer("lm1", Broken("lm1", "text-to-text"), tmp_path)
    with TestClient(create_app(server, load_in_background=False)) as client:
        ready = client.get("/readyz")
        assert ready.status_code == 503 and "weights missing" in ready.json()["detail"]
        response = client.post("/infer", json={"id": "x", "lm": "lm1", "prompts": []})
        assert response.status_code == 503


def _model_server_process(progress: Path, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    """`lmedge model-server` (stub) as a child process, without waiting for readiness."""
    port = free_port()
    code = "import sys; from lmedge.cli import main; main(sys.argv[1:])"
    args = [sys.executable, "-c", code, "model-server", "--lm", "lm1", "--modality",
            "text-to-text", "--progress-dir", str(progress), "--port", str(port)]  # fmt: skip
    with log.open("ab") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    return proc, f"http://127.0.0.1:{port}"


def _readiness(url: str, proc: subprocess.Popen[bytes], want: int) -> httpx.Response:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the model server exited"
        try:
            response = httpx.get(url + "/readyz", timeout=2)
            if response.status_code == want:
                return response
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"/readyz never answered {want}")


def test_unwritable_progress_directory_fails_readiness_with_the_reason(tmp_path: Path) -> None:
    """Not ready (503 and why, in the startup log too) instead of ready-and-500 on every set;
    a directory that stops being writable later turns the pod unready again."""
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")  # unwritable even for root: mkdir under a file fails
    log = tmp_path / "model-server.log"
    proc, url = _model_server_process(blocker / "progress", log)
    try:
        ready = _readiness(url, proc, 503)
        detail = ready.json()["detail"]
        assert "progress directory" in detail and "not writable" in detail
        body = {"id": "s1", "lm": "lm1", "prompts": [{"text": "x"}]}
        assert httpx.post(url + "/infer", json=body, timeout=10).status_code == 503
        assert "not writable" in log.read_text()  # the startup log says why
    finally:
        proc.terminate()
        proc.wait(timeout=10)

    progress = tmp_path / "progress"
    proc, url = _model_server_process(progress, log)
    try:
        _readiness(url, proc, 200)
        progress.rmdir()
        progress.write_text("")  # the directory is gone, a file in its place
        assert "not writable" in _readiness(url, proc, 503).json()["detail"]
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.mark.parametrize(
    ("kind", "modality", "path", "message"),
    [
        ("gpu-magic", "text-to-text", None, "unknown backend"),
        ("text-to-image", "text-to-text", None, "serves text-to-image LMs"),
        ("text-generation", "text-to-text", None, "needs --model-path"),
    ],
    ids=["unknown", "wrong-modality", "no-weights"],
)
def test_backend_configuration_errors(
    kind: str, modality: Any, path: Path | None, message: str
) -> None:
    from lmedge.errors import ConfigError

    with pytest.raises(ConfigError, match=message):
        load_backend(kind, lm="lm1", modality=modality, model_path=path)


# -- real backends on tiny local models ------------------------------------------------


def _byte_level_tokenizer(directory: Path) -> Any:
    """A GPT-2 style byte-level BPE tokenizer trained here on a few sentences."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GPT2TokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    corpus = ["the edge node serves language models", "a red bicycle on a hill"] * 20
    tok.train_from_iterator(corpus, trainer)
    fast = GPT2TokenizerFast(
        tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|endoftext|>"
    )
    fast.save_pretrained(directory)
    return fast


def tiny_gpt2(directory: Path) -> Path:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    tok = _byte_level_tokenizer(directory)
    config = GPT2Config(
        vocab_size=len(tok), n_positions=128, n_embd=32, n_layer=1, n_head=2,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
    )  # fmt: skip
    GPT2LMHeadModel(config).save_pretrained(directory)
    return directory


def tiny_blip(directory: Path) -> Path:
    import torch
    from transformers import (
        BertTokenizerFast,
        BlipConfig,
        BlipForConditionalGeneration,
        BlipImageProcessor,
        BlipProcessor,
    )

    torch.manual_seed(0)
    words = [
        "[PAD]",
        "[UNK]",
        "[CLS]",
        "[SEP]",
        "[MASK]",
        "a",
        "photo",
        "of",
        "red",
        "cat",
        "describe",
    ]
    vocab = directory / "vocab.txt"
    directory.mkdir(parents=True, exist_ok=True)
    vocab.write_text("\n".join(words) + "\n")
    tokenizer = BertTokenizerFast(vocab_file=str(vocab))
    processor = BlipProcessor(
        image_processor=BlipImageProcessor(size={"height": 32, "width": 32}), tokenizer=tokenizer
    )
    text = {
        "vocab_size": len(words), "hidden_size": 32, "num_hidden_layers": 1,
        "num_attention_heads": 2, "intermediate_size": 37, "bos_token_id": 2,
        "sep_token_id": 3, "pad_token_id": 0, "eos_token_id": 3,
    }  # fmt: skip
    vision = {
        "hidden_size": 32, "image_size": 32, "patch_size": 8, "num_hidden_layers": 1,
        "num_attention_heads": 2, "intermediate_size": 37,
    }  # fmt: skip
    config = BlipConfig(text_config=text, vision_config=vision, projection_dim=32)
    BlipForConditionalGeneration(config).save_pretrained(directory)
    processor.save_pretrained(directory)
    return directory


def tiny_stable_diffusion(directory: Path) -> Path:
    import torch
    from diffusers import (
        AutoencoderKL,
        DDIMScheduler,
        StableDiffusionPipeline,
        UNet2DConditionModel,
    )
    from transformers import CLIPTextConfig, CLIPTextModel

    torch.manual_seed(0)
    tok = _byte_level_tokenizer(directory / "tok")
    unet = UNet2DConditionModel(
        block_out_channels=(8, 16), layers_per_block=1, sample_size=8, in_channels=4,
        out_channels=4, down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"), cross_attention_dim=16,
        norm_num_groups=4, attention_head_dim=2,
    )  # fmt: skip
    vae = AutoencoderKL(
        block_out_channels=(8, 16), in_channels=3, out_channels=3,
        down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
        up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"), latent_channels=4,
        norm_num_groups=4, sample_size=16,
    )  # fmt: skip
    text_encoder = CLIPTextModel(
        CLIPTextConfig(
            vocab_size=len(tok), hidden_size=16, intermediate_size=37, num_attention_heads=2,
            num_hidden_layers=1, max_position_embeddings=77, bos_token_id=tok.bos_token_id,
            eos_token_id=tok.eos_token_id, pad_token_id=tok.eos_token_id,
        )
    )  # fmt: skip
    tok.model_max_length = 77
    tok.pad_token = tok.eos_token
    pipe = StableDiffusionPipeline(
        unet=unet, vae=vae, text_encoder=text_encoder, tokenizer=tok,
        scheduler=DDIMScheduler(steps_offset=1, clip_sample=False), safety_checker=None,
        feature_extractor=None, requires_safety_checker=False,
    )  # fmt: skip
    pipe.save_pretrained(directory)
    return directory


def _serve(
    kind: str, lm: str, modality: Any, weights: Path, tmp: Path, prompt: dict[str, Any]
) -> Any:
    backend = load_backend(
        kind, lm=lm, modality=modality, model_path=weights, device="cpu",
        max_new_tokens=5, image_steps=2, image_size=16,
    )  # fmt: skip
    server = ModelServer(lm, backend, tmp / "progress")
    with TestClient(create_app(server, load_in_background=False)) as client:
        assert client.get("/readyz").status_code == 200
        body = {"id": f"{lm}-1", "lm": lm, "prompts": [prompt, prompt]}
        response = client.post("/infer", json=body)
    assert response.status_code == 200, response.text
    result = response.json()
    assert result["complete"] and result["mode"] == "cpu" and result["inference_s"] > 0
    assert result["outputs"][0] == result["outputs"][1]  # greedy / seeded: deterministic
    return result["outputs"][0]


@needs_torch
@pytest.mark.slow
def test_text_generation_backend_on_tiny_gpt2(tmp_path: Path) -> None:
    weights = tiny_gpt2(tmp_path / "gpt2")
    output = _serve(
        "text-generation", "lm1", "text-to-text", weights, tmp_path,
        {"text": "the edge node", "max_tokens": 4},
    )  # fmt: skip
    assert isinstance(output["text"], str) and output.get("image") is None


@needs_torch
@pytest.mark.slow
def test_image_to_text_backend_on_tiny_blip(tmp_path: Path) -> None:
    weights = tiny_blip(tmp_path / "blip")
    image = base64.b64encode(png_bytes(4, 4, b"\xff\x00\x00" * 16)).decode()
    output = _serve(
        "image-to-text", "lm3", "image-to-text", weights, tmp_path,
        {"text": "a photo of", "image": image},
    )  # fmt: skip
    assert isinstance(output["text"], str)


@needs_torch
@pytest.mark.slow
def test_text_to_image_backend_on_tiny_stable_diffusion(tmp_path: Path) -> None:
    weights = tiny_stable_diffusion(tmp_path / "sd")
    output = _serve(
        "text-to-image", "lm4", "text-to-image", weights, tmp_path, {"text": "a red bicycle"}
    )
    png = base64.b64decode(output["image"])
    assert png.startswith(b"\x89PNG")


@needs_torch
@pytest.mark.slow
def test_text_generation_streams_what_it_generates(tmp_path: Path) -> None:
    """`/infer/stream` on tiny GPT-2: the pieces add up to `/infer`'s text; a prompt
    plus max_tokens past the context (128 positions) is a 422 before any event."""
    weights = tiny_gpt2(tmp_path / "gpt2")
    backend = load_backend(
        "text-generation", lm="lm1", modality="text-to-text", model_path=weights, device="cpu"
    )
    server = ModelServer("lm1", backend, tmp_path / "progress")
    prompt = {"text": "the edge node", "max_tokens": 6}
    with TestClient(create_app(server, load_in_background=False)) as client:
        whole = client.post("/infer", json={"id": "w", "lm": "lm1", "prompts": [prompt]}).json()
        response = client.post("/infer/stream", json={"id": "s", "lm": "lm1", "prompts": [prompt]})
        long = {"text": "the edge node", "max_tokens": 200}
        too_long = client.post("/infer/stream", json={"id": "l", "lm": "lm1", "prompts": [long]})
    assert response.status_code == 200 and response.headers["content-type"].startswith(
        "text/event-stream"
    )
    events = [json.loads(line[6:]) for line in response.text.splitlines() if line]
    assert events[-1]["done"]
    assert events[-1]["completion_tokens"] == whole["outputs"][0]["completion_tokens"]
    assert "".join(e.get("text", "") for e in events) == whole["outputs"][0]["text"]
    assert too_long.status_code == 422 and "context of 128" in too_long.json()["detail"]
