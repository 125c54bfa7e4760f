"""Episodic memory for the planner: which past epochs to show it (paper §IV-A).

The controller stores one `MemoryCase` per epoch; the planner prompt carries
only a few of them, so the prompt stays the same size however long the run:

- the best past epoch (lowest objective): a precedent to refine;
- the worst past epoch: a negative precedent to avoid;
- the epochs whose traffic mix is most similar (cosine of the per-LM prompt
  vectors) to the latest one: what worked under this load.

Cases without an objective (no request finished) are never selected.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from lmedge.api import MemoryCase


@dataclass(frozen=True)
class SelectedCase:
    label: str  # "best", "worst" or "similar"
    case: MemoryCase


def traffic_similarity(a: dict[str, int], b: dict[str, int]) -> float:
    """Cosine similarity of two per-LM prompt counts (0 when either is empty)."""
    keys = set(a) | set(b)
    dot = sum(a.get(k, 0) * b.get(k, 0) for k in keys)
    na = math.sqrt(sum(v * v for v in a.values()))
    nb = math.sqrt(sum(v * v for v in b.values()))
    return dot / (na * nb) if na > 0 and nb > 0 else 0.0


def select_cases(
    cases: Sequence[MemoryCase], traffic: dict[str, int], similar: int = 1
) -> list[SelectedCase]:
    """Best, worst and the `similar` most similar-traffic cases, each epoch at most once."""
    scored = [c for c in cases if c.objective is not None]
    if not scored:
        return []
    out: list[SelectedCase] = []
    used: set[tuple[str, int]] = set()

    def add(label: str, c: MemoryCase) -> None:
        if (c.run, c.epoch) not in used:
            used.add((c.run, c.epoch))
            out.append(SelectedCase(label, c))

    by_obj = sorted(scored, key=lambda c: (c.objective, -c.epoch))
    add("best", by_obj[0])
    add("worst", by_obj[-1])
    if traffic:
        ranked = sorted(scored, key=lambda c: (-traffic_similarity(traffic, c.traffic), -c.epoch))
        for c in ranked:
            if sum(1 for s in out if s.label == "similar") >= similar:
                break
            add("similar", c)
    return out
