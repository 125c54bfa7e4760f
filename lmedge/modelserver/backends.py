"""Model backends: what turns one prompt into one output inside a model pod.

* `stub`: deterministic outputs after a fixed delay per prompt; no ML stack.
  It stands in for a model in the gateway's tests and benchmark and in
  emulator-free demos on a laptop.
* `text-generation` (GPT-2 family), `image-to-text` (BLIP) with transformers,
  `text-to-image` (Stable Diffusion) with diffusers — in `lmedge.modelserver.hf`,
  imported only when chosen, so the control plane never pulls in torch.

Every backend loads its weights from a local path (baked into the image by its
Dockerfile, as the paper pre-caches them); none downloads from a hub.

`Backend.stream` yields a prompt's output piece by piece (for `/infer/stream`):
text pieces as the model decodes them, then one last `Output` with no text and
the token counts. Closing the iterator stops the generation. Backends that do
not produce text token by token (BLIP, Stable Diffusion) yield their whole
output as one piece.
"""

from __future__ import annotations

import base64
import hashlib
import struct
import time
import zlib
from collections.abc import Generator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

from lmedge.api.inference import Output, Prompt
from lmedge.api.resources import Modality
from lmedge.errors import ConfigError

__all__ = ["BACKENDS", "Backend", "StubBackend", "load_backend", "png_bytes"]

BackendKind = Literal["stub", "text-generation", "image-to-text", "text-to-image"]
BACKENDS: dict[str, Modality | None] = {
    "stub": None,
    "text-generation": "text-to-text",
    "image-to-text": "image-to-text",
    "text-to-image": "text-to-image",
}


class Backend(Protocol):
    """One loaded model. `load` is slow (weights to memory); `run` serves one prompt;
    `stream` serves one prompt piece by piece (see the module docstring).

    Both raise `ValueError` for a prompt the model cannot take (no image, a
    prompt plus `max_tokens` longer than the model's context).
    """

    mode: Literal["gpu", "cpu"]

    def load(self) -> None: ...

    def run(self, prompt: Prompt) -> Output: ...

    def stream(self, prompt: Prompt) -> Generator[Output, None, None]: ...


def png_bytes(width: int, height: int, rgb: bytes) -> bytes:
    """A PNG of `width` x `height` RGB pixels (`rgb` row-major), standard library only."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    rows = b"".join(b"\x00" + rgb[y * width * 3 : (y + 1) * width * 3] for y in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


@dataclass
class StubBackend:
    """Deterministic stand-in: `seconds` per prompt, output derived from the prompt.

    Text modalities answer `"<lm>: <digest of the prompt>"`; text-to-image
    answers an 8x8 PNG whose colour is the digest. Its "tokenizer" counts
    whitespace-separated words, so token counts are reported as a real
    server's are. `stream` yields the same text in `STREAM_PIECES` pieces
    (the name, then the digest four hex digits at a time), `seconds` spread
    over them. `context_tokens` (None: unlimited) bounds prompt words plus
    `max_tokens`, as a real model's context does.
    """

    lm: str
    modality: Modality
    seconds: float = 0.0
    mode: Literal["gpu", "cpu"] = "cpu"
    context_tokens: int | None = None

    #: Pieces of one streamed text output.
    STREAM_PIECES = 5

    def load(self) -> None:
        return None

    def run(self, prompt: Prompt) -> Output:
        self._check(prompt)
        if self.seconds > 0:
            time.sleep(self.seconds)
        digest = self._digest(prompt)
        if self.modality == "text-to-image":
            png = png_bytes(8, 8, digest[:3] * 64)
            return Output(image=base64.b64encode(png).decode())
        text = f"{self.lm}: {digest.hex()[:16]}"
        return Output(
            text=text,
            prompt_tokens=len(prompt.text.split()),
            completion_tokens=len(text.split()),
        )

    def stream(self, prompt: Prompt) -> Generator[Output, None, None]:
        if self.modality == "text-to-image":
            yield self.run(prompt)
            return
        self._check(prompt)
        hexes = self._digest(prompt).hex()[:16]
        pieces = [
            f"{self.lm}:",
            *(f"{' ' if i == 0 else ''}{hexes[i : i + 4]}" for i in (0, 4, 8, 12)),
        ]
        for piece in pieces:
            if self.seconds > 0:
                time.sleep(self.seconds / len(pieces))
            yield Output(text=piece)
        text = "".join(pieces)
        yield Output(prompt_tokens=len(prompt.text.split()), completion_tokens=len(text.split()))

    def _check(self, prompt: Prompt) -> None:
        if self.context_tokens is None:
            return
        used = len(prompt.text.split()) + (prompt.max_tokens or 0)
        if used > self.context_tokens:
            raise ValueError(
                f"the prompt ({len(prompt.text.split())} tokens) plus max_tokens "
                f"({prompt.max_tokens or 0}) exceed the model's context "
                f"of {self.context_tokens} tokens"
            )

    @staticmethod
    def _digest(prompt: Prompt) -> bytes:
        return hashlib.sha256(f"{prompt.text}\x00{prompt.image or ''}".encode()).digest()


def load_backend(
    kind: str,
    *,
    lm: str,
    modality: Modality,
    model_path: Path | None,
    device: str = "auto",
    stub_seconds: float = 0.0,
    max_new_tokens: int = 32,
    image_steps: int = 20,
    image_size: int = 512,
) -> Backend:
    """Build (not load) the backend named `kind`; `ConfigError` for a bad combination."""
    if kind not in BACKENDS:
        raise ConfigError(f"unknown backend {kind!r}; choose one of {', '.join(BACKENDS)}")
    if kind == "stub":
        return StubBackend(lm=lm, modality=modality, seconds=stub_seconds)
    expected = BACKENDS[kind]
    if modality != expected:
        raise ConfigError(f"backend {kind} serves {expected} LMs, but {lm} is {modality}")
    if model_path is None or not model_path.is_dir():
        raise ConfigError(f"backend {kind} needs --model-path, a directory of local weights")
    try:
        from lmedge.modelserver import hf
    except ImportError as exc:
        raise ConfigError(
            f"backend {kind} needs the model-server extra: "
            f"pip install 'lmedge[model-server]' ({exc})"
        ) from exc
    if kind == "text-generation":
        return hf.TextGenerationBackend(model_path, device=device, max_new_tokens=max_new_tokens)
    if kind == "image-to-text":
        return hf.ImageToTextBackend(model_path, device=device, max_new_tokens=max_new_tokens)
    return hf.TextToImageBackend(model_path, device=device, steps=image_steps, size=image_size)
