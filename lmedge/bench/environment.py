"""What a result was measured with: Python, lmedge and the dependency set.

Reports (`lmedge reproduce`, `lmedge bench`) carry this so a reader can tell
whether two results are comparable. The dependency set is checked against
`requirements.lock` (the resolved versions CI installs) when the report is
made from a source checkout that has one.
"""

from __future__ import annotations

import platform
import re
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import lmedge

#: The lock of a source checkout (absent from an installed wheel).
LOCK = Path(lmedge.__file__).resolve().parent.parent / "requirements.lock"


@dataclass
class Environment:
    python: str
    lmedge: str
    platform: str
    #: None without a lock to compare with.
    locked: int | None = None
    #: "name: installed X, locked Y" for every installed package off its pin.
    differences: list[str] = field(default_factory=list)
    #: Locked packages not installed (an optional extra left out).
    missing: list[str] = field(default_factory=list)

    def sentence(self) -> str:
        """One line for a report."""
        head = f"Python {self.python}, lmedge {self.lmedge}, {self.platform}"
        if self.locked is None:
            return f"{head}; no requirements.lock to compare the dependencies with."
        absent = f" ({len(self.missing)} optional ones not installed)" if self.missing else ""
        if not self.differences:
            return f"{head}; dependencies as pinned in requirements.lock{absent}."
        shown = "; ".join(self.differences[:5])
        more = f" (+{len(self.differences) - 5} more)" if len(self.differences) > 5 else ""
        return (
            f"{head}; {len(self.differences)} of {self.locked} dependencies differ from "
            f"requirements.lock: {shown}{more}{absent}."
        )

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _canon(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_lock(path: Path) -> dict[str, str]:
    """{package: version} pinned in a pip-compile style lock file."""
    pins: dict[str, str] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        m = re.match(r"^([A-Za-z0-9_.\-]+)==([^\s;]+)", line)
        if m:
            pins[_canon(m[1])] = m[2]
    return pins


def environment(lock: Path | None = LOCK) -> Environment:
    """The running interpreter's environment, compared with `lock` if it exists."""
    env = Environment(
        python=platform.python_version(),
        lmedge=_version("lmedge") or "unknown",
        platform=f"{platform.system()} {platform.machine()}",
    )
    if lock is None or not lock.is_file():
        return env
    pins = read_lock(lock)
    env.locked = len(pins)
    for name, want in sorted(pins.items()):
        got = _version(name)
        if got is None:
            env.missing.append(name)
        elif got != want:
            env.differences.append(f"{name}: installed {got}, locked {want}")
    return env


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None
