"""Report figures a reader can read: labelled axes with units, τ, burst phases, both formats."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

from lmedge.bench import plots


def _summary(policy: str, seed: int) -> dict[str, Any]:
    windows = [
        {"start_slot": 10 * i, "objective": 0.1 * (i + 1), "jain": 0.9, "lm_mean_latency_s": 50.0}
        for i in range(4)
    ]
    per_lm = [
        {"lm": lm, "mean_latency_s": 10.0 * (k + 1), "success_ratio": 0.9}
        for k, lm in enumerate(("lm1", "lm2"))
    ]
    return {"policy": policy, "seed": seed, "windows": windows, "per_lm": per_lm}


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_bench_figures_have_units_tau_and_both_formats(tmp_path: Path) -> None:
    runs = [_summary(p, s) for p in ("ma", "rr") for s in (1, 2)]
    plots.fig9(runs, tmp_path / "fig9", "t", slot_s=30, formats=("png", "svg"))
    plots.fig7(runs, tmp_path / "fig7", "t", tau_s=900, formats=("png", "svg"))
    plots.fig6(runs, tmp_path / "fig6", "t", tau_s=900, formats=("png", "svg"))
    fig9 = (tmp_path / "fig9.svg").read_text()
    assert "slot (30 s each)" in fig9 and "objective J (lower is better)" in fig9
    assert "ma (rolling 3)" in fig9 and "rr (rolling 3)" in fig9
    for name in ("fig6", "fig7"):
        assert "τ = 900 s" in (tmp_path / f"{name}.svg").read_text()
    assert "latency (s, log scale)" in (tmp_path / "fig7.svg").read_text()
    # 8 in at 150 dpi: at least ~1,200 px wide (tight bounding box aside)
    assert _png_size(tmp_path / "fig9.png")[0] >= 1100


def test_bursty_figure_shades_the_burst_phases(tmp_path: Path) -> None:
    curves = {"ma": [{"end_slot": e, "objective": 0.2, "lo": 0.1, "hi": 0.3} for e in (5, 10, 15)]}
    phases = [["steady", 0, 5], ["burst", 5, 10], ["recovery", 10, 15]]
    plots.fig9_bursty({"lm1": [1.0, 2.0, 3.0]}, curves, phases, 5, tmp_path / "f", "t",
                      formats=("svg",))  # fmt: skip
    svg = (tmp_path / "f.svg").read_text()
    assert svg.count("fill: #fdd0a2") == 2  # one band per panel, on the burst only


def test_eleven_policies_get_eleven_distinct_colours() -> None:
    names = ["ma", "mal", "perllm", "milp", "rr", "rl", "al", "ll", "rf", "cema", "lyreo-greedy"]
    assert len({plots.colour(n, k) for k, n in enumerate(names)}) == 11
