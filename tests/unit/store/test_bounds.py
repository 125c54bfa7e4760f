"""What an LLM reply brings into a `Decision` is bounded before it can reach the store."""

from __future__ import annotations

import bson
import pytest

from lmedge.api.decisions import (
    MAX_RAW_CHARS,
    MAX_TEXT_CHARS,
    MAX_TOKENS,
    MAX_VIOLATIONS,
    Decision,
    RoutingMap,
    cap_violations,
)
from lmedge.store.documents import to_document


def _decision(**fields: object) -> Decision[RoutingMap]:
    return Decision[RoutingMap](
        agent="scheduler", policy="agentic", source="llm", value=RoutingMap(routes=[]), **fields
    )


@pytest.mark.parametrize(
    ("given", "kept"),
    [(2**64 + 1, MAX_TOKENS), (2**63, MAX_TOKENS), (-5, 0), (12.0, 12), (1234, 1234)],
    ids=["above-2^64", "2^63", "negative", "integral-float", "plain"],
)
def test_token_counts_are_clamped_into_what_bson_stores(given: int, kept: int) -> None:
    d = _decision(tokens_in=given, tokens_out=given)
    assert d.tokens_in == d.tokens_out == kept
    bson.encode(to_document(d))  # storable


def test_a_huge_reply_is_kept_as_a_prefix_with_its_length() -> None:
    raw = "{" + " " * (5 * MAX_RAW_CHARS) + "}"
    d = _decision(raw=raw, error="e" * 10_000, model="m" * 10_000)
    assert d.raw == raw[:MAX_RAW_CHARS] and d.raw_chars == len(raw)
    assert len(d.error or "") == len(d.model or "") == MAX_TEXT_CHARS
    again = Decision[RoutingMap].model_validate(d.model_dump(mode="json"))
    assert (again.raw, again.raw_chars) == (d.raw, d.raw_chars)  # a stored one reads back
    assert _decision(raw="{}").raw_chars == 2


def test_violations_are_bounded_in_number_and_length() -> None:
    d = _decision(violations=["x" * 5_000] * (MAX_VIOLATIONS + 50))
    assert len(d.violations) == MAX_VIOLATIONS
    assert all(len(v) <= MAX_TEXT_CHARS for v in d.violations)
    assert d.violations[-1] == "... and 51 more violations"
    assert cap_violations(["a", "b"]) == ["a", "b"]
