"""Extracting the decision from an LLM reply, and bounding its usage numbers.

The replies models really send: JSON alone, behind a BOM, in a code fence with
prose around it, or inline in a sentence that has braces of its own.
"""

from __future__ import annotations

from typing import Any

import pytest

from lmedge.agents.llm import MAX_TOKENS, _token_count, extract_json

OBJ = {"routes": [{"origin": "worker-1", "lm": "lm1", "destination": "worker-2"}]}
TEXT = '{"routes": [{"origin": "worker-1", "lm": "lm1", "destination": "worker-2"}]}'

FOUND: list[tuple[str, str]] = [
    ("plain", TEXT),
    ("whitespace", f"\n  {TEXT}  \n"),
    ("bom", "\ufeff" + TEXT),
    ("fence", f"```json\n{TEXT}\n```"),
    ("fence-without-language", f"```\n{TEXT}\n```"),
    ("prose-around-fence", f"Here you go:\n\n```json\n{TEXT}\n```\nAll {{constraints}} hold."),
    ("inline-in-prose", f"Sure! {TEXT} Hope this helps."),
    ("stray-brace-before", f"Given {{load}} and {{queues}}: {TEXT}"),
    ("bom-and-fence", f"\ufeff```json\n{TEXT}\n```"),
]


@pytest.mark.parametrize("reply", [c[1] for c in FOUND], ids=[c[0] for c in FOUND])
def test_the_object_is_found(reply: str) -> None:
    assert extract_json(reply) == (OBJ, None)


NOT_FOUND: list[tuple[str, str, str]] = [
    ("prose-only", "I cannot decide without more data.", "Expecting value"),
    ("truncated", '{"routes": [{"origin": "worker-1", ', "Expecting"),
    ("nan", '{"p": NaN}', "NaN is not a JSON number"),
    ("infinity-in-fence", '```json\n{"p": Infinity}\n```', "Infinity is not a JSON number"),
    ("negative-infinity-inline", 'ok: {"p": -Infinity}', "-Infinity is not a JSON number"),
]


@pytest.mark.parametrize(
    ("reply", "why"), [c[1:] for c in NOT_FOUND], ids=[c[0] for c in NOT_FOUND]
)
def test_no_object_says_why(reply: str, why: str) -> None:
    value, problem = extract_json(reply)
    assert value is None
    assert problem is not None and why in problem


def test_a_long_reply_without_json_is_given_up_on() -> None:
    # Many `{` and no object: bounded work, and a reason.
    value, problem = extract_json("{ not json " * 10_000)
    assert value is None and problem


USAGE: list[tuple[str, Any, int | None]] = [
    ("int", 120, 120),
    ("zero", 0, 0),
    ("integral-float", 12.0, 12),
    ("at-the-bound", MAX_TOKENS, MAX_TOKENS),
    ("above-the-bound", MAX_TOKENS + 1, None),
    ("beyond-int64", 2**64 + 1, None),
    ("negative", -5, None),
    ("fraction", 3.7, None),
    ("string", "12", None),
    ("bool", True, None),
    ("null", None, None),
    ("nan", float("nan"), None),
]


@pytest.mark.parametrize(("value", "count"), [c[1:] for c in USAGE], ids=[c[0] for c in USAGE])
def test_token_counts_are_trusted_only_when_plausible(value: Any, count: int | None) -> None:
    assert _token_count(value) == count
