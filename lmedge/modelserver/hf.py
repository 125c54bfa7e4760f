"""transformers / diffusers backends: GPT-2 family, BLIP, Stable Diffusion.

Imported only when such a backend is chosen (torch is in the `model-server`
extra). Weights load from a local directory with `local_files_only=True`, so a
missing file fails at start instead of reaching for a hub. On GPU the weights
are spread over the pod's vGPUs with `device_map="auto"` (paper §V-C);
`low_cpu_mem_usage` keeps the peak memory near the model size (paper §V-B).
Decoding is greedy, so a prompt gives the same output on every run.

Streaming (`stream`): GPT-2 family text comes through transformers'
`TextIteratorStreamer`, `generate` running in a thread; closing the iterator
stops that thread at the next token (a stopping criterion). BLIP and Stable
Diffusion answer in one piece.
"""

from __future__ import annotations

import base64
import io
import threading
from collections.abc import Generator
from pathlib import Path
from typing import Any, Literal

import torch

from lmedge.api.inference import Output, Prompt
from lmedge.errors import ConfigError

__all__ = ["ImageToTextBackend", "TextGenerationBackend", "TextToImageBackend"]


def _device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"device {device} asked for, but torch sees no GPU")
    return device


def _dtype_keyword() -> str:
    """The dtype keyword of `from_pretrained`: `dtype` since transformers 4.56."""
    import transformers
    from packaging.version import Version

    return "dtype" if Version(transformers.__version__) >= Version("4.56") else "torch_dtype"


def _decode_image(data: str | None) -> Any:
    from PIL import Image

    if not data:
        raise ValueError("this LM needs an image")
    return Image.open(io.BytesIO(base64.b64decode(data))).convert("RGB")


class _HFBackend:
    def __init__(self, path: Path, *, device: str) -> None:
        self.path = path
        self.device = _device(device)
        self.mode: Literal["gpu", "cpu"] = "gpu" if self.device.startswith("cuda") else "cpu"

    def _placement(self) -> dict[str, Any]:
        if self.mode == "gpu":
            return {"device_map": "auto", _dtype_keyword(): torch.float16}
        return {}


class TextGenerationBackend(_HFBackend):
    """Causal LM text generation (GPT-2, GPT-2 large)."""

    def __init__(self, path: Path, *, device: str, max_new_tokens: int) -> None:
        super().__init__(path, device=device)
        self.max_new_tokens = max_new_tokens
        self._model: Any = None
        self._tokenizer: Any = None

    def load(self) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self._tokenizer = AutoTokenizer.from_pretrained(self.path, local_files_only=True)
        self._model = AutoModelForCausalLM.from_pretrained(
            self.path, local_files_only=True, low_cpu_mem_usage=True, **self._placement()
        )
        if self.mode == "cpu":
            self._model.to(self.device)
        self._model.eval()

    def _inputs(self, prompt: Prompt) -> tuple[Any, int]:
        """The tokenized prompt and its new-token limit; `ValueError` past the context."""
        tok = self._tokenizer
        text = prompt.text or tok.bos_token or " "
        inputs = tok(text, return_tensors="pt").to(self._model.device)
        limit = prompt.max_tokens or self.max_new_tokens
        config = self._model.config
        context = getattr(config, "n_positions", None) or getattr(
            config, "max_position_embeddings", None
        )
        used = int(inputs["input_ids"].shape[1])
        if context and used + limit > context:
            raise ValueError(
                f"the prompt ({used} tokens) plus max_tokens ({limit}) exceed "
                f"the model's context of {context} tokens"
            )
        return inputs, limit

    def stream(self, prompt: Prompt) -> Generator[Output, None, None]:
        from transformers import StoppingCriteria, StoppingCriteriaList, TextIteratorStreamer

        tok = self._tokenizer
        inputs, limit = self._inputs(prompt)
        stop = threading.Event()

        class _Stop(StoppingCriteria):
            def __call__(self, *_: Any, **__: Any) -> bool:
                return stop.is_set()

        streamer = TextIteratorStreamer(tok, skip_prompt=True, skip_special_tokens=True)
        counted: list[int] = []
        failed: list[Exception] = []

        def generate() -> None:
            try:
                with torch.inference_mode():
                    out = self._model.generate(
                        **inputs,
                        max_new_tokens=limit,
                        do_sample=False,
                        pad_token_id=tok.eos_token_id,
                        streamer=streamer,
                        stopping_criteria=StoppingCriteriaList([_Stop()]),
                    )
                counted.append(len(out[0]) - int(inputs["input_ids"].shape[1]))
            except Exception as exc:  # ends the stream instead of leaving its reader waiting
                failed.append(exc)
                streamer.end()  # type: ignore[no-untyped-call]

        worker = threading.Thread(target=generate, name="generate", daemon=True)
        worker.start()
        try:
            for piece in streamer:
                if piece:
                    yield Output(text=piece)
        finally:
            stop.set()
            worker.join()
        if failed:
            raise RuntimeError(f"generation failed: {failed[0]}") from failed[0]
        used = int(inputs["input_ids"].shape[1])
        yield Output(prompt_tokens=used, completion_tokens=counted[0] if counted else None)

    def run(self, prompt: Prompt) -> Output:
        tok = self._tokenizer
        inputs, limit = self._inputs(prompt)
        with torch.inference_mode():
            out = self._model.generate(
                **inputs,
                max_new_tokens=limit,
                do_sample=False,
                pad_token_id=tok.eos_token_id,
            )
        used = int(inputs["input_ids"].shape[1])
        new = out[0][used:]
        return Output(
            text=tok.decode(new, skip_special_tokens=True),
            prompt_tokens=used,
            completion_tokens=len(new),
        )


class ImageToTextBackend(_HFBackend):
    """BLIP image captioning; the prompt text, if any, conditions the caption."""

    def __init__(self, path: Path, *, device: str, max_new_tokens: int) -> None:
        super().__init__(path, device=device)
        self.max_new_tokens = max_new_tokens
        self._model: Any = None
        self._processor: Any = None

    def load(self) -> None:
        from transformers import BlipForConditionalGeneration, BlipProcessor

        self._processor = BlipProcessor.from_pretrained(self.path, local_files_only=True)
        self._model = BlipForConditionalGeneration.from_pretrained(
            self.path, local_files_only=True, low_cpu_mem_usage=True, **self._placement()
        )
        if self.mode == "cpu":
            self._model.to(self.device)
        self._model.eval()

    def run(self, prompt: Prompt) -> Output:
        image = _decode_image(prompt.image)
        kwargs: dict[str, Any] = {"images": image, "return_tensors": "pt"}
        if prompt.text:
            kwargs["text"] = prompt.text
        inputs = self._processor(**kwargs).to(self._model.device, self._model.dtype)
        with torch.inference_mode():
            out = self._model.generate(
                **inputs, max_new_tokens=prompt.max_tokens or self.max_new_tokens, do_sample=False
            )
        # The caption is the generated sequence (it starts from the text hint, if any).
        used = int(inputs["input_ids"].shape[1]) if "input_ids" in inputs else 0
        return Output(
            text=self._processor.decode(out[0], skip_special_tokens=True),
            prompt_tokens=used,
            completion_tokens=max(len(out[0]) - used, 0),
        )

    def stream(self, prompt: Prompt) -> Generator[Output, None, None]:
        yield self.run(prompt)


class TextToImageBackend(_HFBackend):
    """Stable Diffusion text-to-image; answers a base64 PNG."""

    def __init__(self, path: Path, *, device: str, steps: int, size: int) -> None:
        super().__init__(path, device=device)
        self.steps = steps
        self.size = size
        self._pipe: Any = None

    def load(self) -> None:
        from diffusers import StableDiffusionPipeline

        # Typed as Any: diffusers is untyped where it is installed and absent where not.
        pipeline: Any = StableDiffusionPipeline
        dtype = torch.float16 if self.mode == "gpu" else torch.float32
        # Cast after loading: the dtype keyword of from_pretrained differs across versions.
        self._pipe = pipeline.from_pretrained(
            self.path,
            local_files_only=True,
            safety_checker=None,
            requires_safety_checker=False,
        ).to(self.device, dtype)
        self._pipe.set_progress_bar_config(disable=True)

    def run(self, prompt: Prompt) -> Output:
        generator = torch.Generator(device="cpu").manual_seed(0)
        with torch.inference_mode():
            result = self._pipe(
                prompt.text,
                num_inference_steps=self.steps,
                height=self.size,
                width=self.size,
                generator=generator,
            )
        buffer = io.BytesIO()
        result.images[0].save(buffer, format="PNG")
        return Output(image=base64.b64encode(buffer.getvalue()).decode())

    def stream(self, prompt: Prompt) -> Generator[Output, None, None]:
        yield self.run(prompt)
