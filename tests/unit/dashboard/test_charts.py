"""The dashboard's SVG charts: values drawn as stored, names escaped, gaps kept."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from lmedge.dashboard.charts import Heatmap, LineChart, Mark, Series, Timeline

NS = "{http://www.w3.org/2000/svg}"


def _parse(svg: str) -> ET.Element:
    return ET.fromstring(svg)  # well-formed XML, or this raises


def test_a_line_chart_draws_every_defined_point_and_breaks_at_gaps() -> None:
    chart = LineChart("t", "x", "y", [Series("lm1", [(0, 0.5), (10, None), (20, 1.0), (30, 0.25)])])
    root = _parse(chart.svg())
    dots = root.findall(f".//{NS}circle")
    assert [(d.get("data-x"), d.get("data-y")) for d in dots] == [
        ("0", "0.5"),
        ("20", "1"),
        ("30", "0.25"),
    ]
    # The None window splits the line: the first point stands alone, no polyline spans the gap.
    lines = root.findall(f".//{NS}polyline")
    assert len(lines) == 1 and len(lines[0].get("points", "").split()) == 2


def test_a_reference_line_is_drawn_and_labelled() -> None:
    chart = LineChart("t", "x", "s", [Series("a", [(0, 10.0)])], reference=(900.0, "τ = 900 s"))
    root = _parse(chart.svg())
    assert len(root.findall(f".//{NS}line[@class='reference']")) == 1
    assert "τ = 900 s" in "".join(root.itertext())


@pytest.mark.parametrize(
    "name", ["<script>alert(1)</script>", 'a"b', "x&y"], ids=["tag", "quote", "amp"]
)
def test_names_from_the_store_are_escaped(name: str) -> None:
    charts = [
        LineChart(name, "x", "y", [Series(name, [(0, 1.0)])]),
        Heatmap(name, [name], [name], {(name, name): 1.0}, "x", "y", marks={(name, name): name}),
        Timeline(name, [name], [Mark(1, name, "#000", False, name, href=f"/{name}")], "x"),
    ]
    for chart in charts:
        root = _parse(chart.svg())
        assert root.find(f".//{NS}script") is None
        assert name in "".join(root.itertext())


def test_a_heatmap_cell_carries_its_value_and_mark() -> None:
    chart = Heatmap(
        "policy", ["lm1", "lm2"], ["w1"], {("lm1", "w1"): 0.25}, "node", "LM", v_max=1.0,
        marks={("lm2", "w1"): "●"},
    )  # fmt: skip
    cells = {
        c.get("data-row"): c for c in _parse(chart.svg()).findall(f".//{NS}rect[@class='cell']")
    }
    assert cells["lm1"].get("data-value") == "0.25" and cells["lm1"].get("data-mark") == ""
    assert cells["lm2"].get("data-value") == "" and cells["lm2"].get("data-mark") == "●"


def test_an_empty_chart_says_so() -> None:
    root = _parse(LineChart("t", "x", "y", [Series("a", [])]).svg())
    assert "no data yet" in "".join(root.itertext())
