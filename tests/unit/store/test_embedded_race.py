"""The embedded store read while another process is creating a collection."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from lmedge.store.backends import open_backend
from lmedge.store.location import parse_store_location


def test_a_collection_file_without_its_table_reads_as_empty(tmp_path: Path) -> None:
    backend = open_backend(parse_store_location(f"embedded://{tmp_path}/s"), create=True)
    backend.insert("decisions", [{"_id": "d1", "agent": "planner"}])
    # What a reader in another process sees between MontyDB creating the
    # file and creating its table.
    half = next((tmp_path / "s").rglob("decisions.collection")).with_name("routing.collection")
    sqlite3.connect(half).close()
    assert half.exists()
    assert list(backend.find("routing", {})) == []
    assert backend.count("routing", {}) == 0
    assert [d["_id"] for d in backend.find("decisions", {"agent": "planner"})] == ["d1"]
    backend.close()
