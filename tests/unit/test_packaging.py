"""The package metadata users install from: license, dependency bounds, the lock."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _lock() -> dict[str, Version]:
    pins: dict[str, Version] = {}
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9_.\-]+)==([^\s;]+)", line)
        if m:
            pins[_canon(m[1])] = Version(m[2])
    return pins


def _canon(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _locked_extras() -> list[str]:
    header = (ROOT / "requirements.lock").read_text().splitlines()[0]
    m = re.search(r"extras: ([^)]*)\)", header)
    assert m, f"requirements.lock header names no extras: {header!r}"
    return m[1].split()


def test_license_is_an_spdx_expression_with_its_file() -> None:
    project = PYPROJECT["project"]
    assert project["license"] == "Apache-2.0"
    for name in project["license-files"]:
        assert (ROOT / name).read_text().lstrip().startswith("Apache License")


def test_every_runtime_dependency_is_bounded_above() -> None:
    # A dependency's next major release may break us; the bound makes it an
    # explicit upgrade instead of a surprise on a fresh install.
    unbounded = [
        dep
        for dep in PYPROJECT["project"]["dependencies"]
        if not any(s.operator in ("<", "<=", "~=", "==") for s in Requirement(dep).specifier)
    ]
    assert unbounded == []


def test_lock_pins_every_dependency_within_its_bounds() -> None:
    pins = _lock()
    deps = list(PYPROJECT["project"]["dependencies"])
    for extra in _locked_extras():
        deps += PYPROJECT["project"]["optional-dependencies"][extra]
    problems = []
    for dep in deps:
        req = Requirement(dep)
        if req.marker is not None and not req.marker.evaluate({"sys_platform": "linux"}):
            continue
        got = pins.get(_canon(req.name))
        if got is None:
            problems.append(f"{req.name}: not in requirements.lock")
        elif not req.specifier.contains(got, prereleases=True):
            problems.append(f"{req.name}: locked {got} outside {req.specifier}")
    assert problems == [], "requirements.lock is stale; run `make lock`: " + "; ".join(problems)
