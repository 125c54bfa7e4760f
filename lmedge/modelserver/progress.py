"""Progress of prompt sets on a host path, so a restarted pod resumes, never repeats.

The paper keeps a CSV flag file on a hostPath volume (§V-D2) so that a pod
recreated mid-set resumes at its last position. Here each set has one JSON
Lines file `<dir>/<set id>.jsonl`:

    {"set": "<id>", "digest": "<sha256 of the prompts>", "k": K}     header
    {"i": 0, "s": 1.92, "out": {"text": "..."}}                          one per finished prompt

A line is appended and fsync'd after each prompt, before the next starts (the
header goes with the first line, so a one-prompt set costs one fsync); a
line torn by a kill is ignored on reading, so that prompt runs again (it never
finished). The digest ties the file to the prompts: a set id reused for other
prompts starts afresh instead of returning stale outputs. The file is removed
once the complete set has been answered.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from lmedge.api.inference import Output, Prompt

__all__ = ["Done", "ProgressLog", "prompts_digest"]


def prompts_digest(prompts: list[Prompt]) -> str:
    h = hashlib.sha256()
    for p in prompts:
        h.update(p.model_dump_json().encode())
        h.update(b"\n")
    return h.hexdigest()


@dataclass(frozen=True)
class Done:
    """A finished prompt: its output and compute time, seconds."""

    output: Output
    seconds: float


@dataclass
class ProgressLog:
    """The progress file of one prompt set."""

    directory: Path
    set_id: str
    prompts: list[Prompt]
    #: fsync after each prompt (default). Without it a line survives a killed
    #: process (the kernel keeps it) but not a node crash; fsync costs ~10 ms.
    fsync: bool = True
    done: dict[int, Done] = field(default_factory=dict)
    _header: str = ""

    @property
    def path(self) -> Path:
        return self.directory / f"{self.set_id}.jsonl"

    def open(self) -> dict[int, Done]:
        """Read what an earlier process finished; start a new file if none or stale."""
        digest = prompts_digest(self.prompts)
        self._header = json.dumps({"set": self.set_id, "digest": digest, "k": len(self.prompts)})
        self.done = {}
        if not (self.path.exists() and self._read(digest)):
            # A fresh set: the file is created with its first finished prompt.
            self.done = {}
            self.path.unlink(missing_ok=True)
            return {}
        # Rewrite (atomically) without any torn last line, so appends start clean.
        tmp = self.path.with_suffix(".tmp")
        with tmp.open("w", encoding="utf-8") as out:
            out.write(self._header + "\n")
            for index, done in sorted(self.done.items()):
                out.write(_line(index, done.output, done.seconds) + "\n")
            self._sync(out)
        tmp.replace(self.path)
        return dict(self.done)

    def record(self, index: int, output: Output, seconds: float) -> None:
        """Persist one finished prompt (durable before this returns)."""
        line = _line(index, output, seconds)
        first = not self.path.exists()
        if first:
            self.directory.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as out:
            out.write((self._header + "\n" if first else "") + line + "\n")
            self._sync(out)
        self.done[index] = Done(output, seconds)

    def _sync(self, out: TextIO) -> None:
        out.flush()
        if self.fsync:
            os.fsync(out.fileno())

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)

    def _read(self, digest: str) -> bool:
        lines = self.path.read_text(encoding="utf-8").splitlines()
        try:
            header = json.loads(lines[0]) if lines else {}
        except json.JSONDecodeError:
            return False
        if header.get("digest") != digest:
            return False
        for line in lines[1:]:
            try:
                item = json.loads(line)
                index, seconds = int(item["i"]), float(item["s"])
                output = Output.model_validate(item["out"])
            except (json.JSONDecodeError, KeyError, TypeError, ValueError):
                continue  # a line torn by a kill: that prompt never finished
            if 0 <= index < len(self.prompts):
                self.done[index] = Done(output, seconds)
        return True


def _line(index: int, output: Output, seconds: float) -> str:
    return json.dumps({"i": index, "s": seconds, "out": output.model_dump(exclude_none=True)})
