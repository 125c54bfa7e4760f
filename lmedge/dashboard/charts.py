"""Charts as plain SVG, rendered on the server.

No JavaScript and no charting library: the dashboard must work offline and
behind `kubectl port-forward`, and an SVG string is testable as text. Every
text that reaches the markup goes through `html.escape`, so a node or LM name
taken from the store cannot inject markup. Each chart carries `data-*`
attributes and `<title>` tooltips with the exact numbers it draws, so a person
hovering (and a browser test) reads the value, not a pixel height.

Deliberately not here: interaction (zoom, brushing). Each view is a page.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from html import escape
from typing import Final

#: Eleven colours that stay distinct side by side (Tableau 10 plus a dark grey),
#: one per LM or policy; the 12th series reuses the first.
PALETTE: Final = (
    "#4e79a7",
    "#f28e2b",
    "#e15759",
    "#76b7b2",
    "#59a14f",
    "#edc948",
    "#b07aa1",
    "#ff9da7",
    "#9c755f",
    "#bab0ac",
    "#3b3b3b",
)
#: Decision sources, coloured the same in every view.
SOURCE_COLOURS: Final = {"llm": "#4e79a7", "rule": "#59a14f", "fallback": "#e15759"}

_W, _H = 640, 260
_LEFT, _RIGHT, _TOP, _BOTTOM = 56, 150, 34, 40


def colour(i: int) -> str:
    """The `i`-th series colour."""
    return PALETTE[i % len(PALETTE)]


def _num(x: float) -> str:
    return f"{x:.1f}".rstrip("0").rstrip(".")


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About `n` round tick values covering [lo, hi]."""
    if hi <= lo:
        return [lo]
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step + 1e-9) + 1)]


def _fmt_tick(x: float) -> str:
    return f"{x:g}" if abs(x) < 1e5 else f"{x:.2g}"


@dataclass(frozen=True)
class Series:
    """One line: a label and (x, y) points; a None y is a gap (an empty window)."""

    label: str
    points: Sequence[tuple[float, float | None]]


@dataclass(frozen=True)
class LineChart:
    """A line chart with labelled axes and an optional horizontal reference line."""

    title: str
    x_label: str
    y_label: str
    series: Sequence[Series]
    y_min: float | None = None
    y_max: float | None = None
    #: (y, label): e.g. the deadline tau on a latency chart.
    reference: tuple[float, str] | None = None
    chart_id: str = field(default="chart")

    def svg(self) -> str:
        """The chart as one `<svg>` element."""
        ys = [y for s in self.series for _, y in s.points if y is not None]
        xs = [x for s in self.series for x, _ in s.points]
        if self.reference:
            ys.append(self.reference[0])
        if not xs or not ys:
            return _empty(self.title, self.chart_id)
        y_lo = self.y_min if self.y_min is not None else min(0.0, min(ys))
        y_hi = self.y_max if self.y_max is not None else max(ys) * 1.05 or 1.0
        x_lo, x_hi = min(xs), max(xs)
        if x_hi == x_lo:
            x_hi = x_lo + 1
        pw, ph = _W - _LEFT - _RIGHT, _H - _TOP - _BOTTOM

        def px(x: float) -> float:
            return _LEFT + (x - x_lo) / (x_hi - x_lo) * pw

        def py(y: float) -> float:
            y = min(max(y, y_lo), y_hi)
            return _TOP + ph - (y - y_lo) / ((y_hi - y_lo) or 1.0) * ph

        out = [_open(self.title, self.chart_id)]
        out += _axes(px, py, (x_lo, x_hi), (y_lo, y_hi), self.x_label, self.y_label)
        if self.reference:
            ry, label = self.reference
            out.append(
                f'<line class="reference" x1="{_LEFT}" x2="{_LEFT + pw}" y1="{py(ry):.1f}" '
                f'y2="{py(ry):.1f}" stroke="#333" stroke-dasharray="6 4"/>'
                f'<text x="{_LEFT + pw - 4}" y="{py(ry) - 4:.1f}" text-anchor="end" '
                f'font-size="11">{escape(label)}</text>'
            )
        for i, s in enumerate(self.series):
            c = colour(i)
            segments: list[list[tuple[float, float]]] = [[]]
            for x, y in s.points:
                if y is None:
                    segments.append([])
                else:
                    segments[-1].append((x, y))
            for seg in segments:
                if len(seg) > 1:
                    pts = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in seg)
                    out.append(
                        f'<polyline fill="none" stroke="{c}" stroke-width="2" points="{pts}"/>'
                    )
            for x, y in s.points:
                if y is not None:
                    out.append(
                        f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="2.5" fill="{c}" '
                        f'data-series="{escape(s.label)}" data-x="{x:g}" data-y="{y:.6g}">'
                        f"<title>{escape(s.label)}: {y:.4g} at {_num(x)}</title></circle>"
                    )
            ly = _TOP + 14 + 16 * i
            out.append(
                f'<rect x="{_W - _RIGHT + 12}" y="{ly - 9}" width="12" height="3" fill="{c}"/>'
                f'<text x="{_W - _RIGHT + 30}" y="{ly - 4}" font-size="12">{escape(s.label)}</text>'
            )
        out.append("</svg>")
        return "".join(out)


@dataclass(frozen=True)
class Heatmap:
    """A grid of cells: rows × columns, shaded by value in [0, `v_max`]."""

    title: str
    rows: Sequence[str]
    columns: Sequence[str]
    values: Mapping[tuple[str, str], float]
    x_label: str
    y_label: str
    v_max: float | None = None
    #: Text drawn in a cell (e.g. a role mark); default the value when the grid is small.
    marks: Mapping[tuple[str, str], str] = field(default_factory=dict)
    unit: str = ""
    chart_id: str = field(default="heatmap")
    #: Label every n-th column only (long timelines).
    column_label_every: int = 1

    def svg(self) -> str:
        """The heatmap as one `<svg>` element, with a legend of the scale."""
        if not self.rows or not self.columns:
            return _empty(self.title, self.chart_id)
        top = max(self.values.values(), default=0.0)
        v_max = self.v_max if self.v_max is not None else (top or 1.0)
        label_w = min(110, 8 + 7 * max(len(r) for r in self.rows))
        cell_w = max(4.0, min(56.0, (_W - label_w - 30) / len(self.columns)))
        cell_h = 22.0
        width = label_w + cell_w * len(self.columns) + 30
        height = _TOP + cell_h * len(self.rows) + 62
        out = [_open(self.title, self.chart_id, width, height)]
        show_numbers = cell_w >= 30
        for ri, row in enumerate(self.rows):
            y = _TOP + ri * cell_h
            out.append(
                f'<text x="{label_w - 6}" y="{y + cell_h / 2 + 4:.1f}" text-anchor="end" '
                f'font-size="12">{escape(row)}</text>'
            )
            for ci, col in enumerate(self.columns):
                x = label_w + ci * cell_w
                v = self.values.get((row, col))
                fill = "#f4f4f4" if v is None else _shade(v / v_max if v_max else 0.0)
                shown = "-" if v is None else f"{v:.4g}"
                mark = self.marks.get((row, col), "")
                out.append(
                    f'<rect class="cell" x="{x:.1f}" y="{y:.1f}" width="{cell_w - 1:.1f}" '
                    f'height="{cell_h - 1:.1f}" fill="{fill}" data-row="{escape(row)}" '
                    f'data-col="{escape(col)}" data-value="{"" if v is None else f"{v:.6g}"}" '
                    f'data-mark="{escape(mark)}"><title>{escape(row)} × {escape(col)}: '
                    f"{shown}{escape(self.unit)}{' ' + escape(mark) if mark else ''}</title></rect>"
                )
                text = mark or (f"{v:.2g}" if show_numbers and v is not None else "")
                if text:
                    dark = v is not None and v_max and v / v_max > 0.55
                    out.append(
                        f'<text x="{x + cell_w / 2:.1f}" y="{y + cell_h / 2 + 4:.1f}" '
                        f'text-anchor="middle" font-size="10" '
                        f'fill="{"#fff" if dark else "#222"}">{escape(text)}</text>'
                    )
        base = _TOP + cell_h * len(self.rows)
        every = max(1, self.column_label_every)
        for ci, col in enumerate(self.columns):
            if ci % every == 0:
                x = label_w + ci * cell_w + cell_w / 2
                out.append(
                    f'<text x="{x:.1f}" y="{base + 14}" text-anchor="middle" font-size="10">'
                    f"{escape(col)}</text>"
                )
        out.append(
            f'<text x="{label_w + cell_w * len(self.columns) / 2:.1f}" y="{base + 32}" '
            f'text-anchor="middle" font-size="12">{escape(self.x_label)}</text>'
            f'<text x="8" y="{_TOP - 6}" font-size="12">{escape(self.y_label)}</text>'
        )
        # The scale: 0 .. v_max in five steps.
        for i in range(6):
            out.append(
                f'<rect x="{label_w + i * 28}" y="{base + 42}" width="27" height="10" '
                f'fill="{_shade(i / 5)}"/>'
            )
        out.append(
            f'<text x="{label_w + 6 * 28 + 6}" y="{base + 51}" font-size="10">'
            f"0 … {v_max:.3g}{escape(self.unit)}</text></svg>"
        )
        return "".join(out)


@dataclass(frozen=True)
class Mark:
    """One point of a `Timeline`."""

    x: float
    lane: str
    colour: str
    hollow: bool
    tip: str
    href: str | None = None


@dataclass(frozen=True)
class Timeline:
    """Points on horizontal lanes (e.g. decisions by agent over slots)."""

    title: str
    lanes: Sequence[str]
    marks: Sequence[Mark]
    x_label: str
    legend: Mapping[str, str] = field(default_factory=dict)
    chart_id: str = field(default="timeline")

    def svg(self) -> str:
        """The timeline as one `<svg>` element; a mark with `href` links to its page."""
        if not self.marks:
            return _empty(self.title, self.chart_id)
        lane_h = 26
        height = _TOP + lane_h * len(self.lanes) + _BOTTOM
        xs = [m.x for m in self.marks]
        x_lo, x_hi = min(xs), max(xs)
        if x_hi == x_lo:
            x_hi = x_lo + 1
        left = max(_LEFT, 14 + 7 * max((len(lane) for lane in self.lanes), default=0))
        pw = _W - left - _RIGHT

        def px(x: float) -> float:
            return left + 8 + (x - x_lo) / (x_hi - x_lo) * (pw - 16)

        out = [_open(self.title, self.chart_id, _W, height)]
        for i, lane in enumerate(self.lanes):
            y = _TOP + i * lane_h + lane_h / 2
            out.append(
                f'<line x1="{left}" x2="{left + pw}" y1="{y}" y2="{y}" stroke="#ddd"/>'
                f'<text x="{left - 6}" y="{y + 4}" text-anchor="end" font-size="12">'
                f"{escape(lane)}</text>"
            )
        base = _TOP + lane_h * len(self.lanes)
        for t in _ticks(x_lo, x_hi, 8):
            out.append(
                f'<text x="{px(t):.1f}" y="{base + 14}" text-anchor="middle" font-size="10">'
                f"{_fmt_tick(t)}</text>"
            )
        out.append(
            f'<text x="{left + pw / 2}" y="{base + 32}" text-anchor="middle" font-size="12">'
            f"{escape(self.x_label)}</text>"
        )
        for m in self.marks:
            if m.lane not in self.lanes:
                continue
            y = _TOP + self.lanes.index(m.lane) * lane_h + lane_h / 2
            fill = "#fff" if m.hollow else m.colour
            dot = (
                f'<circle class="mark" cx="{px(m.x):.1f}" cy="{y}" r="5" fill="{fill}" '
                f'stroke="{m.colour}" stroke-width="2"><title>{escape(m.tip)}</title></circle>'
            )
            out.append(f'<a href="{escape(m.href)}">{dot}</a>' if m.href else dot)
        for i, (label, c) in enumerate(self.legend.items()):
            ly = _TOP + 14 + 16 * i
            out.append(
                f'<circle cx="{_W - _RIGHT + 18}" cy="{ly - 4}" r="5" fill="{c}"/>'
                f'<text x="{_W - _RIGHT + 30}" y="{ly}" font-size="12">{escape(label)}</text>'
            )
        out.append("</svg>")
        return "".join(out)


def _shade(t: float) -> str:
    """White to dark blue, for t in [0, 1]."""
    t = min(max(t, 0.0), 1.0)
    lo, hi = (247, 251, 255), (8, 48, 107)
    r, g, b = (round(a + (b_ - a) * t) for a, b_ in zip(lo, hi, strict=True))
    return f"#{r:02x}{g:02x}{b:02x}"


def _open(title: str, chart_id: str, width: float = _W, height: float = _H) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" id="{escape(chart_id)}" class="chart" '
        f'role="img" aria-label="{escape(title)}" width="{width:.0f}" height="{height:.0f}" '
        f'viewBox="0 0 {width:.0f} {height:.0f}" font-family="sans-serif">'
        f"<title>{escape(title)}</title>"
        f'<text class="chart-title" x="8" y="16" font-size="13" font-weight="bold">'
        f"{escape(title)}</text>"
    )


def _empty(title: str, chart_id: str) -> str:
    return (
        _open(title, chart_id, _W, 60)
        + '<text x="12" y="44" font-size="13" fill="#666">no data yet</text></svg>'
    )


def _axes(
    px: Callable[[float], float],
    py: Callable[[float], float],
    x_range: tuple[float, float],
    y_range: tuple[float, float],
    x_label: str,
    y_label: str,
) -> list[str]:
    pw, ph = _W - _LEFT - _RIGHT, _H - _TOP - _BOTTOM
    out = [
        f'<line x1="{_LEFT}" x2="{_LEFT}" y1="{_TOP}" y2="{_TOP + ph}" stroke="#333"/>'
        f'<line x1="{_LEFT}" x2="{_LEFT + pw}" y1="{_TOP + ph}" y2="{_TOP + ph}" stroke="#333"/>'
    ]
    for t in _ticks(*y_range):
        y = py(t)
        out.append(
            f'<line x1="{_LEFT}" x2="{_LEFT + pw}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>'
            f'<text x="{_LEFT - 6}" y="{y + 4:.1f}" text-anchor="end" font-size="10">'
            f"{_fmt_tick(t)}</text>"
        )
    for t in _ticks(*x_range, 8):
        x = px(t)
        out.append(
            f'<text x="{x:.1f}" y="{_TOP + ph + 14}" text-anchor="middle" font-size="10">'
            f"{_fmt_tick(t)}</text>"
        )
    out.append(
        f'<text x="{_LEFT + pw / 2}" y="{_H - 6}" text-anchor="middle" font-size="12">'
        f"{escape(x_label)}</text>"
        f'<text transform="translate(14 {_TOP + ph / 2}) rotate(-90)" text-anchor="middle" '
        f'font-size="12">{escape(y_label)}</text>'
    )
    return out
