"""How many input and output tokens a request has: a parametric model or a trace file.

`lognormal` (the default) draws each length from a lognormal with the given
mean and log-space sigma, mu = ln(mean) - sigma^2 / 2, rounded to an integer
of at least 1. The default means are LMSYS-Chat-1M's published per-turn means
(69.5 prompt, 214.5 response tokens; LYREO uses 70 / 215); the sigmas (1.0,
0.8) are assumptions that give the heavy right tail of chat traces (medians
~42 and ~155), a calibration knob, not a fit. `trace` samples (input, output)
pairs with replacement from a JSON-lines file. Either way a pair longer than
the engine's context is clipped: the input to context - 1, then the output to
what the context leaves (clipping lowers the means a little).

It does not decide when requests arrive (`lmedge.sim.workload`) and is not
yet read by a scenario: the emulator's integration is a later step.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
from pydantic import Field

from lmedge.api.base import PosFloat, SpecModel
from lmedge.errors import ManifestError
from lmedge.sim.trace import json_lines


class LognormalLengths(SpecModel):
    """Input and output lengths, each lognormal with a given mean and log-space sigma."""

    kind: Literal["lognormal"] = "lognormal"
    input_mean: PosFloat = Field(default=69.5, description="Mean prompt tokens (LMSYS-Chat-1M).")
    input_sigma: float = Field(default=1.0, ge=0, le=4, description="Sigma of ln(prompt tokens).")
    output_mean: PosFloat = Field(
        default=214.5, description="Mean response tokens (LMSYS-Chat-1M)."
    )
    output_sigma: float = Field(
        default=0.8, ge=0, le=4, description="Sigma of ln(response tokens)."
    )


class TraceLengths(SpecModel):
    """(input, output) pairs drawn with replacement from a JSON-lines file."""

    kind: Literal["trace"]
    file: str = Field(
        min_length=1,
        description="JSON lines of {input_tokens, output_tokens}; path relative to the scenario.",
    )


TokenLengthsSpec = Annotated[LognormalLengths | TraceLengths, Field(discriminator="kind")]


def read_length_trace(path: Path) -> np.ndarray:
    """The (n, 2) int array of a length trace; a bad line is a `ManifestError` naming it."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ManifestError(str(path), "", f"cannot read length trace: {exc.strerror}") from exc
    rows: list[tuple[int, int]] = []
    for n, row in json_lines(path, text):
        if set(row) != {"input_tokens", "output_tokens"}:
            raise ManifestError(
                str(path), f"line {n}", "each line must be {input_tokens: n, output_tokens: n}"
            )
        pair = row["input_tokens"], row["output_tokens"]
        for name, v in zip(("input_tokens", "output_tokens"), pair, strict=True):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ManifestError(str(path), f"line {n}: {name}", "must be an integer >= 1")
        rows.append(pair)
    if not rows:
        raise ManifestError(str(path), "", "the length trace has no pairs")
    return np.array(rows, dtype=np.int64)


class LengthSampler:
    """Draws (input, output) token counts for a `TokenLengthsSpec`; deterministic for an rng."""

    def __init__(self, spec: LognormalLengths | TraceLengths, base_dir: Path = Path()) -> None:
        self.spec = spec
        self._pairs = (
            read_length_trace(base_dir / spec.file) if isinstance(spec, TraceLengths) else None
        )

    def draw(
        self, rng: np.random.Generator, n: int, context_tokens: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """`n` input and output lengths (int arrays), clipped to `context_tokens` (>= 2)."""
        if context_tokens < 2:
            raise ValueError("context_tokens must be at least 2 (one input, one output token)")
        if self._pairs is not None:
            idx = rng.integers(0, len(self._pairs), size=n)
            inp, out = self._pairs[idx, 0], self._pairs[idx, 1]
        else:
            spec = self.spec
            assert isinstance(spec, LognormalLengths)
            inp = _lognormal(rng, spec.input_mean, spec.input_sigma, n)
            out = _lognormal(rng, spec.output_mean, spec.output_sigma, n)
        inp = np.minimum(inp, context_tokens - 1)
        out = np.minimum(out, context_tokens - inp)
        return inp, out


def _lognormal(rng: np.random.Generator, mean: float, sigma: float, n: int) -> np.ndarray:
    mu = math.log(mean) - sigma * sigma / 2
    return np.maximum(1, np.rint(rng.lognormal(mu, sigma, size=n))).astype(np.int64)
