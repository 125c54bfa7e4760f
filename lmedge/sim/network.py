"""Transmission delays between nodes, from payload size and link class.

delay = latency + payload_bits / bandwidth, with three link classes:

- local (origin == destination): 0 -- the request never leaves the node;
- same site: the sending node's `intraSiteBandwidthMbps` / `intraSiteLatencyMs`;
- cross site: the sending node's `links` entry for the other site, else the
  receiving node's entry for this site, else any node's at the sending site.

Links are not shared: concurrent transfers do not slow each other down
(assumption: payloads are at most a few MB against 1-10 Gbit/s links, so
transfer times are milliseconds against service times of seconds).
"""

from __future__ import annotations

from collections.abc import Sequence

from lmedge.api.observations import NodeInfo

KIB_BITS = 1024 * 8


class Network:
    """Delay lookups with per node-pair (latency s, bandwidth bit/s) precomputed lazily."""

    def __init__(self, nodes: Sequence[NodeInfo]) -> None:
        self._nodes = {n.name: n for n in nodes}
        self._site_links: dict[tuple[str, str], tuple[float, float]] = {}
        for n in nodes:
            for lk in n.spec.links:
                self._site_links.setdefault(
                    (n.spec.site, lk.site), (lk.latency_ms / 1000.0, lk.bandwidth_mbps * 1e6)
                )
        self._pairs: dict[tuple[str, str], tuple[float, float]] = {}

    def link(self, src: str, dst: str) -> tuple[float, float]:
        """(latency s, bandwidth bit/s) from `src` to `dst`; (0, inf) when local."""
        key = (src, dst)
        hit = self._pairs.get(key)
        if hit is not None:
            return hit
        a, b = self._nodes[src].spec, self._nodes[dst].spec
        if src == dst:
            val = (0.0, float("inf"))
        elif a.site == b.site:
            val = (a.intra_site_latency_ms / 1000.0, a.intra_site_bandwidth_mbps * 1e6)
        else:
            own = next((lk for lk in a.links if lk.site == b.site), None)
            back = next((lk for lk in b.links if lk.site == a.site), None)
            if own is not None:
                val = (own.latency_ms / 1000.0, own.bandwidth_mbps * 1e6)
            elif back is not None:
                val = (back.latency_ms / 1000.0, back.bandwidth_mbps * 1e6)
            else:
                site = self._site_links.get((a.site, b.site)) or self._site_links.get(
                    (b.site, a.site)
                )
                if site is None:
                    raise KeyError(f"no link between sites {a.site!r} and {b.site!r}")
                val = site
        self._pairs[key] = val
        return val

    def delay(self, src: str, dst: str, kib: float) -> float:
        """Seconds to send `kib` KiB from `src` to `dst`."""
        if src == dst:
            return 0.0
        lat, bw = self.link(src, dst)
        return lat + kib * KIB_BITS / bw

    def distance(self, src: str, dst: str) -> float:
        """Ordering key for the nearest node: local < same site < cross site by latency."""
        if src == dst:
            return 0.0
        return self.link(src, dst)[0] + 1e-9
