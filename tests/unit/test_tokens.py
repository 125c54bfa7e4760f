"""Bearer tokens (lmedge.tokens): the one reading of an `Authorization` header
the gateways and the dashboard share, and the token the HTTP clients send."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from lmedge.errors import ConfigError
from lmedge.tokens import BearerToken, bearer_token, same_token


@pytest.mark.parametrize(
    ("header", "token"),
    [
        ("Bearer abc", "abc"),
        ("bearer abc", "abc"),
        ("BEARER abc", "abc"),
        ("  Bearer   abc  ", "abc"),
        ("bearer  abc ", "abc"),
        ("abc", None),
        ("Basic abc", None),
        ("Bearer", None),
        ("Bearer ", None),
        ("Bearer a b", None),
        ("", None),
        (None, None),
    ],
    ids=["bearer", "lower", "upper", "spaces", "case-and-space", "no-scheme", "basic",
         "scheme-only", "empty-token", "two-tokens", "empty", "absent"],
)  # fmt: skip
def test_bearer_token(header: str | None, token: str | None) -> None:
    assert bearer_token(header) == token


@pytest.mark.parametrize(
    ("given", "expected", "same"),
    [("abc", "abc", True), ("abc", "abd", False), ("ab", "abc", False), ("", "abc", False)],
    ids=["equal", "one-char", "prefix", "empty"],
)
def test_same_token(given: str, expected: str, same: bool) -> None:
    assert same_token(given, expected) is same


def sent(auth: BearerToken) -> str:
    """The `Authorization` header a client with `auth` sends."""
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers["authorization"])
        return httpx.Response(204)

    with httpx.Client(auth=auth, transport=httpx.MockTransport(handler)) as client:
        client.get("http://gateway/control/status")
    return seen[0]


def test_a_token_is_sent_as_bearer() -> None:
    assert sent(BearerToken(" abc\n")) == "Bearer abc"


def test_a_token_file_is_read_again_once_rotated(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("first\n")
    auth = BearerToken(path)
    assert sent(auth) == "Bearer first"
    path.write_text("second-token\n")
    # A rotation is seen by its mtime or size; the size differs, whatever the clock.
    assert sent(auth) == "Bearer second-token"


def test_an_unreadable_file_keeps_the_last_token(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("first")
    auth = BearerToken(path)
    path.unlink()
    assert sent(auth) == "Bearer first"


@pytest.mark.parametrize(
    ("content", "message"),
    [("  \n", "is empty"), (None, "cannot read the token file")],
    ids=["empty-file", "missing-file"],
)
def test_a_bad_token_file_is_one_config_error(
    tmp_path: Path, content: str | None, message: str
) -> None:
    path = tmp_path / "token"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError, match=message):
        BearerToken(path)
