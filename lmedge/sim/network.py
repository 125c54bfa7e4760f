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
    """Delay lookups: O(1) per call from per-node link tables (no per-pair cache,
    which would grow with the square of the node count)."""

    def __init__(self, nodes: Sequence[NodeInfo]) -> None:
        self._site: dict[str, str] = {}
        self._intra: dict[str, tuple[float, float]] = {}
        self._links: dict[str, dict[str, tuple[float, float]]] = {}
        self._site_links: dict[tuple[str, str], tuple[float, float]] = {}
        for n in nodes:
            sp = n.spec
            self._site[n.name] = sp.site
            self._intra[n.name] = (
                sp.intra_site_latency_ms / 1000.0,
                sp.intra_site_bandwidth_mbps * 1e6,
            )
            own = {lk.site: (lk.latency_ms / 1000.0, lk.bandwidth_mbps * 1e6) for lk in sp.links}
            self._links[n.name] = own
            for site, val in own.items():
                self._site_links.setdefault((sp.site, site), val)

    def link(self, src: str, dst: str) -> tuple[float, float]:
        """(latency s, bandwidth bit/s) from `src` to `dst`; (0, inf) when local."""
        if src == dst:
            return (0.0, float("inf"))
        a, b = self._site[src], self._site[dst]
        if a == b:
            return self._intra[src]
        val = (
            self._links[src].get(b)
            or self._links[dst].get(a)
            or self._site_links.get((a, b))
            or self._site_links.get((b, a))
        )
        if val is None:
            raise KeyError(f"no link between sites {a!r} and {b!r}")
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
