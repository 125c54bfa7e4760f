"""Parsing the one store setting (`--store` / `$LMEDGE_STORE`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from lmedge.errors import StoreError
from lmedge.store.location import DEFAULT_STORE, STORE_ENV, STORE_FILE_ENV, parse_store_location


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
    [
        ("   ", "is empty"),
        ("embedded://", "names no directory"),
        ("redis://x", "'redis'"),
        ("mongodb://db.example:27017/admin", "the MongoDB server's own database 'admin'"),
        ("mongodb://u:p@h1,h2/local?replicaSet=rs", "own database 'local'"),
        ("mongodb+srv://cluster.example/config", "own database 'config'"),
        ("mongodb://h/%61dmin", "own database 'admin'"),
        ("mongodb://h/Admin", "own database 'Admin'"),
    ],
    ids=["blank", "no-dir", "scheme", "admin", "local", "config", "escaped-admin", "cased-admin"],
)
def test_bad_settings_are_store_errors(setting: str, message: str) -> None:
    with pytest.raises(StoreError, match=message):
        parse_store_location(setting)


def test_the_uri_can_come_from_a_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A URI with a password is mounted as a Secret file, never an environment value.
    uri = tmp_path / "uri"
    uri.write_text("mongodb://u:secret@db.example:27017/lmedge?authSource=admin\n")
    monkeypatch.delenv(STORE_ENV, raising=False)
    monkeypatch.setenv(STORE_FILE_ENV, str(uri))
    assert parse_store_location(None).uri == (
        "mongodb://u:secret@db.example:27017/lmedge?authSource=admin"
    )
    monkeypatch.setenv(STORE_ENV, "embedded:///elsewhere")  # the variable wins
    assert parse_store_location(None).kind == "embedded"
    monkeypatch.delenv(STORE_ENV)
    for text, message in (("", "is empty"), (None, "No such file")):
        if text is None:
            uri.unlink()
        else:
            uri.write_text(text)
        with pytest.raises(StoreError, match=message):
            parse_store_location(None)


@pytest.mark.parametrize(
    "setting",
    ["mongodb://h:27017", "mongodb://h/", "mongodb://u:p@h/lmedge?authSource=admin",
     "mongodb://h/administration"],
    ids=["no-database", "empty-database", "auth-source-admin", "admin-prefix"],
)  # fmt: skip
def test_a_database_of_lmedges_own_is_fine(setting: str) -> None:
    assert parse_store_location(setting).uri == setting
