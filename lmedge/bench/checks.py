"""The building blocks of the reproduction's report: tables, checks, sections.

A `Check` is one ordering or claim of the paper evaluated on lmedge's
numbers: it holds, does not hold, or cannot be evaluated, and always says
why, in numbers. The helpers here compute the common shapes (who is lowest,
is a chain ordered) so every section words its reasons the same way.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from lmedge.bench import lyreo_paper, paper


@dataclass(frozen=True)
class Check:
    """One ordering or claim of the paper, evaluated on lmedge's numbers.

    `holds` is None when it could not be evaluated (a method or a field is
    missing); `reason` says why in every case.
    """

    claim: str
    ref: str
    holds: bool | None
    reason: str


@dataclass(frozen=True)
class TableData:
    """A table with a title; cells are numbers, strings or None (shown as –)."""

    title: str
    header: tuple[str, ...]
    rows: tuple[tuple[Any, ...], ...]


@dataclass
class Section:
    """One of the paper's results: its tables, checks and figure files."""

    key: str
    title: str
    ref: str
    note: str = ""
    tables: list[TableData] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    figures: list[str] = field(default_factory=list)


def label(p: str) -> str:
    return paper.LABELS.get(p) or lyreo_paper.LABELS.get(p, p)


def fmt(x: float | None, digits: int = 1) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f}%"


def reduction(ours: float | None, theirs: float | None) -> float | None:
    """1 - ours / theirs: how much lower `ours` is (negative when higher)."""
    if ours is None or theirs is None or theirs <= 0:
        return None
    return 1.0 - ours / theirs


def ranked(values: dict[str, float | None]) -> list[tuple[str, float]]:
    return sorted(((p, v) for p, v in values.items() if v is not None), key=lambda kv: kv[1])


def listing(values: Sequence[tuple[str, float]], digits: int = 1) -> str:
    return ", ".join(f"{label(p)} {v:.{digits}f}" for p, v in values)


def extreme_check(
    claim: str,
    ref: str,
    values: dict[str, float | None],
    who: str,
    *,
    lowest: bool,
    digits: int = 1,
) -> Check:
    """Does `who` have the lowest (or highest) value among `values`?"""
    ascending = ranked(values)
    have = dict(ascending)
    if who not in have:
        why = "not run" if who not in values else "no value (nothing of that kind occurred)"
        return Check(claim, ref, None, f"{label(who)}: {why}")
    if len(ascending) < 2:
        return Check(claim, ref, None, f"{label(who)} {have[who]:.{digits}f}: no rival measured")
    order = ascending if lowest else ascending[::-1]
    mine = have[who]
    ties = [p for p, v in ascending if p != who and round(v, digits) == round(mine, digits)]
    if ties:  # the paper's orderings are strict: a tie does not make one method the best
        return Check(
            claim,
            ref,
            False,
            f"{label(who)} {mine:.{digits}f} ties with {', '.join(map(label, ties))}",
        )
    best_p, best_v = order[0]
    if best_p == who:
        next_p, next_v = order[1]
        return Check(
            claim,
            ref,
            True,
            f"{label(who)} {mine:.{digits}f}; next {label(next_p)} {next_v:.{digits}f}",
        )
    return Check(
        claim,
        ref,
        False,
        f"{label(who)} {mine:.{digits}f}, but {label(best_p)} {best_v:.{digits}f} "
        f"({'lower' if lowest else 'higher'})",
    )


def chain_check(
    claim: str,
    ref: str,
    values: dict[str, float | None],
    chain: Sequence[str],
    digits: int = 1,
) -> Check:
    """Is values[chain[0]] < values[chain[1]] < ...?"""
    missing = [p for p in chain if values.get(p) is None]
    if missing:
        return Check(claim, ref, None, f"not measured: {', '.join(map(label, missing))}")
    shown = ", ".join(f"{label(p)} {values[p]:.{digits}f}" for p in chain)
    for a, b in itertools.pairwise(chain):
        va, vb = values[a], values[b]
        assert va is not None and vb is not None
        if not va < vb:
            return Check(claim, ref, False, f"{shown}: {label(a)} is not below {label(b)}")
    return Check(claim, ref, True, shown)
