"""Recorded request traces: one row per request (slot, origin, lm, prompts, offset_s).

CSV (with that header) or JSONL (one object per line). A trace replaces the
workload generator; it is read and validated when the scenario is loaded, so
a bad row is reported before anything runs, naming the file and line.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmedge.errors import ManifestError

TRACE_FIELDS = ("slot", "origin", "lm", "prompts", "offset_s")


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """One request to be submitted: K prompts of one LM at one origin, `offset_s` into the slot.

    A request of a mobile user (`workload.users`, `lmedge.sim.radio`) names the
    user and where it is (m); `origin` is then the server nearest to it.
    """

    slot: int
    origin: str
    lm: str
    prompts: int
    offset_s: float
    user: int = -1
    x_m: float = 0.0
    y_m: float = 0.0


def read_trace(
    path: Path, origins: Collection[str], lms: Collection[str], slot_s: float
) -> dict[int, list[RequestSpec]]:
    """Requests by slot; rows with 0 prompts are dropped (no request)."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ManifestError(str(path), "", f"cannot read trace: {exc}") from exc
    out: dict[int, list[RequestSpec]] = {}
    seen: set[tuple[int, str, str]] = set()
    for n, r in _rows(path, text):
        where = f"line {n}"
        try:
            slot, prompts = int(r["slot"]), int(r["prompts"])
            origin, lm, offset = str(r["origin"]), str(r["lm"]), float(r.get("offset_s") or 0.0)
        except (KeyError, TypeError, ValueError) as exc:
            raise ManifestError(
                str(path), where, f"needs {', '.join(TRACE_FIELDS)}: {exc}"
            ) from exc
        if slot < 0 or prompts < 0:
            raise ManifestError(str(path), f"{where}: slot/prompts", "must not be negative")
        if origin not in origins:
            raise ManifestError(str(path), f"{where}: origin", f"{origin!r} is not a worker node")
        if lm not in lms:
            raise ManifestError(str(path), f"{where}: lm", f"unknown LMService {lm!r}")
        if not 0 <= offset < slot_s:
            raise ManifestError(str(path), f"{where}: offset_s", f"must be in [0, {slot_s:g})")
        if (slot, origin, lm) in seen:
            raise ManifestError(str(path), where, f"second request for ({slot}, {origin}, {lm})")
        seen.add((slot, origin, lm))
        if prompts:
            out.setdefault(slot, []).append(RequestSpec(slot, origin, lm, prompts, offset))
    return out


def json_lines(path: Path, text: str) -> list[tuple[int, dict[str, Any]]]:
    """(line number, object) of each non-blank line of a JSON-lines file's `text`.

    A line that is not JSON, or not an object, is a `ManifestError` naming it.
    """
    rows: list[tuple[int, dict[str, Any]]] = []
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ManifestError(str(path), f"line {n}", f"not valid JSON: {exc.msg}") from exc
        if not isinstance(obj, dict):
            raise ManifestError(str(path), f"line {n}", "each line must be a JSON object")
        rows.append((n, obj))
    return rows


def _rows(path: Path, text: str) -> list[tuple[int, dict[str, Any]]]:
    rows: list[tuple[int, dict[str, Any]]] = []
    if path.suffix in (".jsonl", ".ndjson"):
        return json_lines(path, text)
    reader = csv.DictReader(text.splitlines())
    missing = [f for f in TRACE_FIELDS if f not in (reader.fieldnames or [])]
    if missing:
        raise ManifestError(str(path), "line 1", f"header lacks {', '.join(missing)}")
    rows.extend((n, dict(r)) for n, r in enumerate(reader, start=2))
    return rows


def trace_row(r: RequestSpec) -> dict[str, Any]:
    return {
        "slot": r.slot,
        "origin": r.origin,
        "lm": r.lm,
        "prompts": r.prompts,
        "offset_s": r.offset_s,
    }
