"""The Prometheus text exposition format, as samples by name.

One parser for every page a node agent reads: the exporters'
(`lmedge.nodeagent.telemetry`) and the token engines' (`lmedge.nodeagent.engines`).
It does not fetch pages.
"""

from __future__ import annotations

from collections import defaultdict

from prometheus_client.parser import text_string_to_metric_families

__all__ = ["Samples", "parse_exposition"]

#: Samples a page yields, by sample name: [(labels, value)].
Samples = dict[str, list[tuple[dict[str, str], float]]]


def parse_exposition(text: str) -> Samples:
    """Every sample of a Prometheus exposition-format text, by sample name.

    Malformed text is prometheus_client's `ValueError`.
    """
    samples: Samples = defaultdict(list)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[sample.name].append((dict(sample.labels), float(sample.value)))
    return dict(samples)
