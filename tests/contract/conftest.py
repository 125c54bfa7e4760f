"""The store under test: the same fixture yields each backend in turn."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from lmedge.store import Store, StoreOptions, open_store

BACKENDS = [
    pytest.param("embedded", id="embedded"),
    pytest.param("ferretdb", id="ferretdb", marks=pytest.mark.ferretdb),
]


def store_uri(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if backend == "embedded":
        return f"embedded://{tmp_path / 'store'}"
    return str(request.getfixturevalue("ferretdb_uri"))


@pytest.fixture(params=BACKENDS)
def store_uri_param(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A URI of an empty store on each backend."""
    return store_uri(request.param, request, tmp_path)


@pytest.fixture
def store(store_uri_param: str, tmp_path: Path) -> Iterator[Store]:
    """An empty, opened store on each backend."""
    with open_store(store_uri_param, options=StoreOptions(spill_dir=tmp_path / "spill")) as s:
        yield s
