"""Token lengths: the lognormal model's means, clipping to the context, and trace files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from pydantic import TypeAdapter, ValidationError

from lmedge.errors import ManifestError
from lmedge.sim.tokens.lengths import (
    LengthSampler,
    LognormalLengths,
    TokenLengthsSpec,
    TraceLengths,
)

SPEC: TypeAdapter[LognormalLengths | TraceLengths] = TypeAdapter(TokenLengthsSpec)


def test_lognormal_means_match_the_configured_means() -> None:
    inp, out = LengthSampler(LognormalLengths()).draw(np.random.default_rng(0), 200_000, 1 << 20)
    assert inp.mean() == pytest.approx(69.5, rel=0.02)
    assert out.mean() == pytest.approx(214.5, rel=0.02)
    assert inp.min() >= 1 and out.min() >= 1
    assert np.median(out) < out.mean()  # the right tail of chat traces


def test_same_seed_same_lengths() -> None:
    s = LengthSampler(LognormalLengths())
    a = s.draw(np.random.default_rng(3), 100, 4096)
    b = s.draw(np.random.default_rng(3), 100, 4096)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def test_pairs_are_clipped_to_the_context() -> None:
    spec = LognormalLengths(input_mean=300, output_mean=300, input_sigma=1.5, output_sigma=1.5)
    inp, out = LengthSampler(spec).draw(np.random.default_rng(1), 10_000, 512)
    assert (inp + out).max() <= 512 and inp.max() == 511 and out.min() >= 1


def test_the_default_config_is_lognormal_and_bad_values_name_the_field() -> None:
    assert isinstance(SPEC.validate_python({"kind": "lognormal"}), LognormalLengths)
    with pytest.raises(ValidationError, match=r"lognormal\.outputMean"):
        SPEC.validate_python({"kind": "lognormal", "outputMean": 0})
    with pytest.raises(ValidationError, match=r"lognormal\.inputSigma"):
        SPEC.validate_python({"kind": "lognormal", "inputSigma": -1})
    with pytest.raises(ValidationError, match=r"trace\.file"):
        SPEC.validate_python({"kind": "trace"})
    with pytest.raises(ValidationError, match="does not match any of the expected tags"):
        SPEC.validate_python({"kind": "zipf"})


def test_a_trace_is_sampled_from_its_pairs(tmp_path: Path) -> None:
    rows = [{"input_tokens": 10, "output_tokens": 20}, {"input_tokens": 30, "output_tokens": 40}]
    (tmp_path / "lengths.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    spec = SPEC.validate_python({"kind": "trace", "file": "lengths.jsonl"})
    inp, out = LengthSampler(spec, tmp_path).draw(np.random.default_rng(0), 1000, 4096)
    assert set(zip(inp.tolist(), out.tolist(), strict=True)) == {(10, 20), (30, 40)}
    inp, out = LengthSampler(spec, tmp_path).draw(np.random.default_rng(0), 1000, 35)
    assert set(zip(inp.tolist(), out.tolist(), strict=True)) == {(10, 20), (30, 5)}


@pytest.mark.parametrize(
    ("text", "field", "message"),
    [
        ('{"input_tokens": 1, "output_tokens": 2}\nnot json\n', "line 2", "not valid JSON"),
        ('{"input_tokens": 1}\n', "line 1", "each line must be"),
        ('{"input_tokens": 0, "output_tokens": 2}\n', "line 1: input_tokens", "integer >= 1"),
        ('{"input_tokens": 1, "output_tokens": 2.5}\n', "line 1: output_tokens", "integer >= 1"),
        ("\n", "", "no pairs"),
    ],
    ids=["json", "keys", "zero", "fraction", "empty"],
)
def test_a_bad_trace_names_the_line(tmp_path: Path, text: str, field: str, message: str) -> None:
    (tmp_path / "t.jsonl").write_text(text)
    with pytest.raises(ManifestError) as exc:
        LengthSampler(TraceLengths(kind="trace", file="t.jsonl"), tmp_path)
    assert exc.value.field == field and message in exc.value.message


def test_a_missing_trace_is_a_manifest_error(tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match="cannot read length trace"):
        LengthSampler(TraceLengths(kind="trace", file="nope.jsonl"), tmp_path)
