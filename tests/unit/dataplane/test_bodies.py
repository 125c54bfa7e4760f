"""What `BodyGuard` looks for in a raw body: lone surrogates and non-finite numbers."""

from __future__ import annotations

import pytest

from lmedge.dataplane.bodies import lone_surrogate, non_finite

SURROGATES: list[tuple[str, bytes, bool]] = [
    ("plain", b'{"text": "hello"}', False),
    ("utf8-emoji", '{"text": "hi \U0001f600"}'.encode(), False),
    ("escaped-pair", b'{"text": "hi \\ud83d\\ude00"}', False),
    ("lone-high", b'{"text": "\\ud800"}', True),
    ("lone-low", b'{"text": "x \\udfff y"}', True),
    ("upper-case-escape", b'{"text": "\\uDBFF"}', True),
    ("in-a-key", b'{"\\ud800": 1}', True),
    ("reversed-pair", b'{"text": "\\ude00\\ud83d"}', True),
    ("escaped-backslash-not-an-escape", b'{"text": "\\\\ud800"}', False),
    ("not-json", b'{"text": "\\ud800', False),
]


@pytest.mark.parametrize(
    ("body", "lone"), [c[1:] for c in SURROGATES], ids=[c[0] for c in SURROGATES]
)
def test_lone_surrogate(body: bytes, lone: bool) -> None:
    assert lone_surrogate(body) is lone


CONSTANTS: list[tuple[str, bytes, str | None]] = [
    ("none", b'{"budget_s": 1.5}', None),
    ("nan", b'{"budget_s": NaN}', "NaN"),
    ("infinity", b'{"budget_s": Infinity}', "Infinity"),
    ("negative-infinity", b'{"x": [1, -Infinity]}', "-Infinity"),
    ("words-in-a-string", b'{"text": "NaN or Infinity"}', None),
    ("truncated-after-nan", b'{"x": NaN', "NaN"),  # a 400 either way
]


@pytest.mark.parametrize(
    ("body", "found"), [c[1:] for c in CONSTANTS], ids=[c[0] for c in CONSTANTS]
)
def test_non_finite(body: bytes, found: str | None) -> None:
    assert non_finite(body) == found
