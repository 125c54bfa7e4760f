"""`lmedge cema make-dataset` and `build-store`, run as a user runs them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from lmedge.policies.cema import dataset, rag_available
from lmedge.policies.cema.store import QualityStore, file_sha256

CLI = [sys.executable, "-c", "from lmedge.cli import main; main()", "cema"]


def cema(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=600)


def test_make_dataset_regenerates_the_committed_file(tmp_path: Path) -> None:
    out = tmp_path / "d.jsonl"
    res = cema("make-dataset", "--out", str(out))
    assert res.returncode == 0, res.stderr
    assert out.read_text() == dataset.DATA_FILE.read_text()
    small = tmp_path / "s.jsonl"
    assert (
        cema("make-dataset", "--out", str(small), "--seed", "5", "--per-family", "3").returncode
        == 0
    )
    assert len(dataset.load(small)) == 3 * len(dataset.FAMILIES)


def test_build_store_from_a_missing_dataset_is_one_line(tmp_path: Path) -> None:
    res = cema("build-store", "--data", str(tmp_path / "none.jsonl"), "--out", str(tmp_path / "s"))
    assert res.returncode == 2
    assert "none.jsonl" in res.stderr and "Traceback" not in res.stderr
    assert not (tmp_path / "s").exists()


@pytest.mark.slow
@pytest.mark.skipif(rag_available() is not None, reason=str(rag_available()))
def test_build_store_embeds_a_dataset(tmp_path: Path) -> None:
    data, out = tmp_path / "d.jsonl", tmp_path / "store.npz"
    data.write_text(dataset.dumps(dataset.generate(5, 4)))
    res = cema("build-store", "--data", str(data), "--out", str(out))
    assert res.returncode == 0, res.stderr
    store = QualityStore.load(out)
    assert store.ids == [r.id for r in dataset.load(data)]
    assert store.source_sha256 == file_sha256(data)
    assert store.embeddings.shape == (12, 384)
