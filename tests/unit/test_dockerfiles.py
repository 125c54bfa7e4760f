"""Every Dockerfile under images/ parses and could build: there is no Docker
engine here, so the checks are the ones a build would fail (or a reviewer
would refuse) on without running anything.

* it parses (dockerfile-parse) into one or more stages, and has a build stage
  and a runtime stage;
* every base image is pinned: an exact version tag (no `latest`, no bare
  major like `3` or `3.11`) or a digest; a `FROM` of an earlier stage is fine;
* every `COPY --from=` names an earlier stage (or a pinned image);
* every file `COPY`/`ADD` takes from the build context exists there and is
  not excluded by the Dockerfile's own `<Dockerfile>.dockerignore`;
* the final stage switches to a non-root `USER` and has an entrypoint/command.

The build context is the repository root unless the Dockerfile says
`# context: <dir>` (relative to the repository root).
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from dockerfile_parse import DockerfileParser

REPO = Path(__file__).resolve().parents[2]
DOCKERFILES = sorted((REPO / "images").glob("*/Dockerfile"))

_DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")
# An exact tag: a version with at least major.minor.patch (3.11.11, v1.8.2,
# 2.4.1-cuda12.4-cudnn9-runtime) — not `latest`, `3`, `3.11` or `slim`.
_EXACT_TAG = re.compile(r"^v?\d+\.\d+\.\d+([.-][\w.-]+)?$")
_VAR = re.compile(r"\$\{?(\w+)(?::-([^}]*))?\}?")


@dataclass
class Stage:
    """One `FROM` block: its base, name and the instructions after it."""

    index: int
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)


def _expand(text: str, args: dict[str, str]) -> str:
    return _VAR.sub(lambda m: args.get(m.group(1)) or (m.group(2) or ""), text)


def stages(path: Path) -> list[Stage]:
    """The stages of `path`, with `ARG` defaults before the first FROM expanded."""
    parser = DockerfileParser(path=str(path))
    global_args: dict[str, str] = {}
    found: list[Stage] = []
    for item in parser.structure:
        instr, value = item["instruction"], item["value"]
        if instr == "COMMENT":
            continue
        if instr == "ARG" and not found:
            name, _, default = value.partition("=")
            global_args[name.strip()] = default.strip().strip('"')
        elif instr == "FROM":
            words = [w for w in value.split() if not w.startswith("--platform")]
            name = words[2] if len(words) >= 3 and words[1].lower() == "as" else None
            found.append(Stage(len(found), _expand(words[0], global_args), name))
        elif not found:
            raise AssertionError(f"{path}: {instr} before the first FROM")
        else:
            found[-1].instructions.append((instr, value))
    return found


def context_of(path: Path) -> Path:
    match = re.search(r"^#\s*context:\s*(\S+)\s*$", path.read_text(), re.MULTILINE)
    return (REPO / (match.group(1) if match else ".")).resolve()


def image_pinned(ref: str) -> bool:
    if _DIGEST.search(ref):
        return True
    name, _, tag = ref.rpartition(":")
    if not name or "/" in tag:  # no tag at all (a registry port is not a tag)
        return False
    return bool(_EXACT_TAG.match(tag))


def _copy_parts(value: str) -> tuple[dict[str, str], list[str]]:
    """Flags and sources of a COPY/ADD value (exec JSON form or shell form)."""
    text = value.strip()
    flags: dict[str, str] = {}
    words = shlex.split(text) if not text.endswith("]") else []
    if text.endswith("]"):
        head, _, rest = text.partition("[")
        flags = dict(f[2:].split("=", 1) for f in head.split() if f.startswith("--"))
        words = json.loads("[" + rest)
    else:
        while words and words[0].startswith("--"):
            key, _, val = words.pop(0)[2:].partition("=")
            flags[key] = val
    return flags, words[:-1]


def ignored(rel: str, patterns: list[str]) -> bool:
    """Docker's rule: the last matching pattern wins; a path is in when a parent is."""
    parts = rel.strip("/").split("/")
    result = False
    for raw in patterns:
        negate = raw.startswith("!")
        pat = raw[1:] if negate else raw
        pat = pat.strip("/")
        for depth in range(1, len(parts) + 1):
            prefix = "/".join(parts[:depth])
            if fnmatch.fnmatchcase(prefix, pat) or (
                pat.startswith("**/") and fnmatch.fnmatchcase(parts[depth - 1], pat[3:])
            ):
                result = not negate
                break
    return result


def dockerignore(path: Path, context: Path) -> list[str]:
    for candidate in (path.with_name(path.name + ".dockerignore"), context / ".dockerignore"):
        if candidate.is_file():
            lines = candidate.read_text().splitlines()
            return [ln.strip() for ln in lines if ln.strip() and not ln.startswith("#")]
    return []


def problems(path: Path) -> list[str]:
    """Everything wrong with `path`, one line each; empty when it passes."""
    found: list[str] = []
    try:
        blocks = stages(path)
    except AssertionError as exc:
        return [str(exc)]
    if not blocks:
        return [f"{path.name}: no FROM"]
    if len(blocks) < 2:
        found.append("not multi-stage: build and runtime share one stage")
    names = {b.name: b.index for b in blocks if b.name}
    for block in blocks:
        earlier = {n for n, i in names.items() if i < block.index}
        if block.base not in earlier and not image_pinned(block.base):
            found.append(f"stage {block.index}: base image {block.base!r} is not pinned")
    context = context_of(path)
    patterns = dockerignore(path, context)
    for block in blocks:
        earlier = {n for n, i in names.items() if i < block.index}
        for instr, value in block.instructions:
            if instr not in ("COPY", "ADD"):
                continue
            flags, sources = _copy_parts(value)
            if "from" in flags:
                ref = flags["from"]
                is_stage = ref in earlier or (ref.isdigit() and int(ref) < block.index)
                if not is_stage and not image_pinned(ref):
                    found.append(f"{instr} --from={ref}: no earlier stage or pinned image")
                continue
            for src in sources:
                if re.match(r"^https?://", src):
                    found.append(f"{instr} {src}: remote sources are not reproducible")
                    continue
                hits = list(context.glob(src.rstrip("/"))) if src.strip("/.") else [context]
                if not hits:
                    found.append(f"{instr} {src}: not in the build context {context}")
                for hit in hits:
                    rel = hit.relative_to(context).as_posix()
                    if rel != "." and ignored(rel, patterns):
                        found.append(f"{instr} {src}: excluded by the .dockerignore")
    final = blocks[-1]
    users = [v.split(":")[0].strip() for i, v in final.instructions if i == "USER"]
    if not users:
        found.append("final stage runs as root: no USER")
    elif users[-1] in ("0", "root"):
        found.append(f"final stage runs as root: USER {users[-1]}")
    if not any(i in ("ENTRYPOINT", "CMD") for i, _ in final.instructions):
        found.append("final stage has no ENTRYPOINT or CMD")
    return found


def test_there_are_images() -> None:
    assert REPO / "images" / "controller" / "Dockerfile" in DOCKERFILES


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.parent.name)
def test_dockerfile_is_buildable_and_hardened(path: Path) -> None:
    assert problems(path) == []


def test_controller_image_runs_the_lmedge_cli() -> None:
    path = REPO / "images" / "controller" / "Dockerfile"
    final = stages(path)[-1]
    entry = [v for i, v in final.instructions if i == "ENTRYPOINT"]
    assert entry == ['["lmedge"]']
    assert 'lmedge = "lmedge.cli:main"' in (REPO / "pyproject.toml").read_text()


# -- the checker catches what it claims to catch ----------------------------------


BAD = """\
FROM python:3.11 AS build
COPY does-not-exist.txt /x
FROM ubuntu
COPY --from=nowhere /a /b
COPY lmedge/ /app/
USER root
"""


def test_checker_reports_every_problem(tmp_path: Path) -> None:
    (tmp_path / "lmedge").mkdir()
    (tmp_path / "Dockerfile.dockerignore").write_text("lmedge\n")
    path = tmp_path / "Dockerfile"
    path.write_text(f"# context: {os.path.relpath(tmp_path, REPO)}\n" + BAD)
    assert problems(path) == [
        "stage 0: base image 'python:3.11' is not pinned",
        "stage 1: base image 'ubuntu' is not pinned",
        "COPY does-not-exist.txt: not in the build context " + str(tmp_path),
        "COPY --from=nowhere: no earlier stage or pinned image",
        "COPY lmedge/: excluded by the .dockerignore",
        "final stage runs as root: USER root",
        "final stage has no ENTRYPOINT or CMD",
    ]


@pytest.mark.parametrize(
    ("ref", "pinned"),
    [
        ("python:3.11.11-slim-bookworm", True),
        ("nvcr.io/nvidia/cuda:12.4.1-runtime-ubuntu22.04", True),
        ("mongo:8.0.4", True),
        ("python@sha256:" + "a" * 64, True),
        ("python:3.11", False),
        ("python:latest", False),
        ("python", False),
        ("localhost:5000/python", False),
    ],
)
def test_pinning(ref: str, pinned: bool) -> None:
    assert image_pinned(ref) is pinned


def test_dockerignore_last_match_wins() -> None:
    patterns = ["*", "!lmedge/", "**/__pycache__"]
    assert ignored("tests", patterns)
    assert not ignored("lmedge/cli/__init__.py", patterns)
    assert ignored("lmedge/cli/__pycache__", patterns)
