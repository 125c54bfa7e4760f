"""Parsing the one store setting (`--store` / `$LMEDGE_STORE`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from lmedge.errors import StoreError
from lmedge.store.location import DEFAULT_STORE, STORE_ENV, parse_store_location


@pytest.mark.parametrize(
    ("setting", "kind", "target"),
    [
        ("mongodb://u:pw@db.example:27017/lm?tls=true", "mongodb", "MongoDB at db.example:27017"),
        ("mongodb+srv://cluster.example/x", "mongodb", "MongoDB at cluster.example"),
        ("embedded:///var/lib/lmedge", "embedded", "embedded store /var/lib/lmedge"),
        ("embedded://runs/store", "embedded", "embedded store runs/store"),
        ("  ./data/store ", "embedded", "embedded store data/store"),
    ],
    ids=["mongodb", "srv", "embedded-abs", "embedded-rel", "plain-path"],
)
def test_settings_name_a_backend_and_hide_credentials(setting: str, kind: str, target: str) -> None:
    location = parse_store_location(setting)
    assert location.kind == kind
    assert location.describe() == target
    assert "pw" not in location.describe()


def test_unset_falls_back_to_the_environment_then_the_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(STORE_ENV, raising=False)
    assert parse_store_location(None).path == Path(DEFAULT_STORE)
    monkeypatch.setenv(STORE_ENV, "mongodb://h:1/x")
    assert parse_store_location(None).uri == "mongodb://h:1/x"
    assert parse_store_location("embedded:///y").path == Path("/y")  # the flag wins


@pytest.mark.parametrize(
    ("setting", "message"),
    [("   ", "is empty"), ("embedded://", "names no directory"), ("redis://x", "'redis'")],
    ids=["blank", "no-dir", "scheme"],
)
def test_bad_settings_are_store_errors(setting: str, message: str) -> None:
    with pytest.raises(StoreError, match=message):
        parse_store_location(setting)
