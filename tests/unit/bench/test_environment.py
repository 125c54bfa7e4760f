"""A report's environment line: the dependency set against the lock."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

from lmedge.bench.environment import environment


def test_a_dependency_off_the_lock_is_named(tmp_path: Path) -> None:
    lock = tmp_path / "requirements.lock"
    pydantic = metadata.version("pydantic")
    lock.write_text(
        f"# header\npydantic=={pydantic}\n    # via lmedge\nPyYAML==0.0.1\nno-such-package==1.0\n"
    )
    env = environment(lock)
    assert env.locked == 3
    assert env.differences == [f"pyyaml: installed {metadata.version('PyYAML')}, locked 0.0.1"]
    assert env.missing == ["no-such-package"]
    assert "1 of 3 dependencies differ" in env.sentence()
    assert "1 optional ones not installed" in env.sentence()


def test_without_a_lock_the_report_says_so(tmp_path: Path) -> None:
    env = environment(tmp_path / "absent.lock")
    assert env.locked is None and env.differences == []
    assert "no requirements.lock" in env.sentence()


def test_the_checkouts_lock_matches_this_environment() -> None:
    # `make install` installs under requirements.lock; an installed package
    # off its pin means the lock or the install drifted, and reports say so.
    env = environment()
    assert env.locked, "the source checkout has a requirements.lock"
    assert env.differences == []
