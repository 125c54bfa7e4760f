"""Profile-based delay estimates shared by the model-based routers (MILP, CEMA, LYREO).

Part of the policy kit: what several plugins share lives here, so no plugin
imports another (the independence contract in `.importlinter`).

These are what a router can *predict* from static profiles and the snapshot —
the paper's "profiled inputs" — not what the emulator will realize: no GPU
time-slicing contention, no CPU core scaling, the median cold start. The gap
between the two is deliberate; it is the profile mismatch the paper blames
for the MILP's LM4 starvation (§VI-A).

Network: delay = one-way latency + payload bits / bandwidth, local = 0, same
site = the sender's intra-site link, cross site = the sender's (else the
receiver's) declared link to the other site. It mirrors `lmedge.sim.network`,
which policies may not import (the layering keeps policies below the emulator).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, cast

from lmedge.api import ClusterContext, Mode, NodeState
from lmedge.api.constants import COLD_START_S

T = TypeVar("T")

KIB_BITS = 1024 * 8
#: Latency and bandwidth when no link between two sites is declared (1 Gbit/s, 5 ms).
DEFAULT_LINK = (0.005, 1e9)


def _link(ctx: ClusterContext, src: str, dst: str) -> tuple[float, float]:
    if src == dst:
        return 0.0, float("inf")
    a, b = ctx.node(src).spec, ctx.node(dst).spec
    if a.site == b.site:
        return a.intra_site_latency_ms / 1000.0, a.intra_site_bandwidth_mbps * 1e6
    for links, site in ((a.links, b.site), (b.links, a.site)):
        for lk in links:
            if lk.site == site:
                return lk.latency_ms / 1000.0, lk.bandwidth_mbps * 1e6
    return DEFAULT_LINK


def transfer_s(ctx: ClusterContext, origin: str, dest: str, lm: str, prompts: int) -> float:
    """Uplink + downlink seconds for `prompts` prompts of `lm` from `origin` to `dest`."""
    if origin == dest or not ctx.has_node(origin):
        return 0.0
    latency, bw = _link(ctx, origin, dest)
    profile = ctx.service(lm).spec.profile
    bits = prompts * (profile.request_kib + profile.response_kib) * KIB_BITS
    return 2 * latency + bits / bw


class Transfers:
    """`transfer_s` from one origin, for many destinations and batch sizes.

    The link to each destination is looked up once (kept in the context's memo,
    per origin), so the MILP's model and its greedy plan, which price every
    (batch, node) pair, pay a dictionary read per pair; the values are
    `transfer_s`'s, computed the same way.
    """

    __slots__ = ("_bits", "_ctx", "_links", "_origin")

    def __init__(self, ctx: ClusterContext, origin: str, lm: str, prompts: int) -> None:
        self._ctx, self._origin = ctx, origin
        if not ctx.has_node(origin):
            self._links: dict[str, tuple[float, float]] | None = None
            self._bits = 0.0
            return
        memo: dict[str, dict[str, tuple[float, float]]] = ctx.memo.setdefault("estimates.links", {})
        links = memo.get(origin)
        if links is None:
            links = memo[origin] = {}
        self._links = links
        profile = ctx.service(lm).spec.profile
        self._bits = prompts * (profile.request_kib + profile.response_kib) * KIB_BITS

    def to(self, dest: str) -> float:
        """Uplink + downlink seconds to `dest`: `transfer_s(ctx, origin, dest, lm, prompts)`."""
        if self._links is None or dest == self._origin:
            return 0.0
        link = self._links.get(dest)
        if link is None:
            link = self._links[dest] = _link(self._ctx, self._origin, dest)
        latency, bw = link
        return 2 * latency + self._bits / bw


def transfer_bits(ctx: ClusterContext, lm: str, prompts: int) -> float:
    """Request + response bits of `prompts` prompts of `lm`, as `transfer_s` counts them."""
    profile = ctx.service(lm).spec.profile
    return prompts * (profile.request_kib + profile.response_kib) * KIB_BITS


def link_arrays(ctx: ClusterContext, origin: str, dests: list[str]) -> tuple[Any, Any]:
    """(2 x one-way latency s, bandwidth bit/s) from `origin` to each of `dests`.

    `lat2 + bits / bw` is `transfer_s` for each, computed the same way: the
    origin itself, and every destination of an origin outside the context,
    get (0, inf), so 0 seconds.
    """
    import numpy as np

    if not ctx.has_node(origin):
        return np.zeros(len(dests)), np.full(len(dests), np.inf)
    links = NodeLinks.of(ctx)
    latency, bw = links.from_node(links.index[origin], [links.index[n] for n in dests])
    return 2 * latency, bw


def allowed_modes(ctx: ClusterContext, cpu_modes: bool) -> dict[tuple[str, str], tuple[Mode, ...]]:
    """`ClusterContext.modes` of every (worker, LM), only GPU modes when `cpu_modes` is off.

    Kept in the context's memo: the MILP's model and greedy plan ask for every
    (batch, node) pair, ~250,000 times a slot at 1,000 workers.
    """
    key = f"estimates.allowed_modes.{cpu_modes}"
    table: dict[tuple[str, str], tuple[Mode, ...]] | None = ctx.memo.get(key)
    if table is None:
        table = {}
        for n in ctx.workers:
            for lm in ctx.lm_names:
                ms = ctx.modes(n.name, lm)
                table[n.name, lm] = ms if cpu_modes else tuple(m for m in ms if m == "gpu")
        ctx.memo[key] = table
    return table


def service_s(ctx: ClusterContext, lm: str, mode: Mode) -> float:
    """Profiled seconds per prompt of `lm` in `mode` (inf when the mode cannot run it)."""
    profile = ctx.service(lm).spec.profile
    if mode == "gpu":
        return profile.gpu_seconds_per_prompt
    if mode == "cpu" and profile.cpu_seconds_per_prompt is not None:
        return profile.cpu_seconds_per_prompt
    return float("inf")


def serving_mode(ctx: ClusterContext, state: NodeState, lm: str) -> tuple[Mode, bool]:
    """(mode the LM would serve in on this node, whether it is already running).

    The running instance's mode when there is one, else the node's fastest mode
    (the one a deployer would start).
    """
    inst = state.instance(lm)
    if inst is not None:
        return inst.mode, True
    modes = ctx.modes(state.name, lm)
    return (modes[0] if modes else "off"), False


def backlog_s(ctx: ClusterContext, state: NodeState, lm: str) -> float:
    """Seconds until a new prompt of `lm` would start on this node: queue + cold start."""
    mode, running = serving_mode(ctx, state, lm)
    per = service_s(ctx, lm, mode) if mode != "off" else float("inf")
    wait = state.backlog.get(lm, 0) * per
    return wait if running else wait + COLD_START_S


class LinkTable:
    """Vectorized `transfer_s` from one origin to many workers (for large clusters).

    Rows are built lazily per origin with numpy over site-level link tables, so
    a 1,000-worker cluster costs one O(workers) row per origin that routes.
    """

    def __init__(self, ctx: ClusterContext) -> None:
        import numpy as np

        self._np = np
        self.ctx = ctx
        self.workers = [n.name for n in ctx.workers]
        self.index = {n: k for k, n in enumerate(self.workers)}
        sites = sorted({n.spec.site for n in ctx.nodes})
        self.site_of = {s: k for k, s in enumerate(sites)}
        self.worker_site = np.array([self.site_of[ctx.node(n).spec.site] for n in self.workers])
        m = len(sites)
        self.site_lat = np.full((m, m), DEFAULT_LINK[0])
        self.site_bw = np.full((m, m), DEFAULT_LINK[1])
        declared = np.zeros((m, m), dtype=bool)
        # A receiver's declared link is used only where the sender declares none.
        for own in (False, True):
            for n in ctx.nodes:
                for lk in n.spec.links:
                    if lk.site not in self.site_of:
                        continue
                    a, b = self.site_of[n.spec.site], self.site_of[lk.site]
                    src, dst = (a, b) if own else (b, a)
                    if own or not declared[src, dst]:
                        self.site_lat[src, dst] = lk.latency_ms / 1000.0
                        self.site_bw[src, dst] = lk.bandwidth_mbps * 1e6
                        declared[src, dst] = True
        self._rows: dict[str, tuple[Any, Any]] = {}

    def row(self, origin: str) -> tuple[Any, Any]:
        """(latency s, bandwidth bit/s) from `origin` to every worker, in worker order."""
        hit = self._rows.get(origin)
        if hit is not None:
            return hit
        np = self._np
        spec = self.ctx.node(origin).spec
        o = self.site_of[spec.site]
        lat = self.site_lat[o, self.worker_site].astype(float)
        bw = self.site_bw[o, self.worker_site].astype(float)
        same = self.worker_site == o
        lat[same] = spec.intra_site_latency_ms / 1000.0
        bw[same] = spec.intra_site_bandwidth_mbps * 1e6
        if origin in self.index:
            lat[self.index[origin]] = 0.0
            bw[self.index[origin]] = np.inf
        self._rows[origin] = (lat, bw)
        return lat, bw

    def transfer(self, origin: str, lm: str, prompts: int, idx: Any) -> Any:
        """Uplink + downlink seconds to the workers at positions `idx`."""
        if not self.ctx.has_node(origin):
            return self._np.zeros(len(idx))
        lat, bw = self.row(origin)
        profile = self.ctx.service(lm).spec.profile
        bits = prompts * (profile.request_kib + profile.response_kib) * KIB_BITS
        return 2 * lat[idx] + bits / bw[idx]


class NodeLinks:
    """`_link`'s rules as arrays over every node of the context, for compiled code.

    For nodes at positions o and d of `ctx.nodes`: the same node is (0, inf);
    the same site is o's intra-site link; else o's first declared link to d's
    site (`out_*[o, site[d]]` where `declared`), else d's first declared link
    to o's site, else `DEFAULT_LINK`: link by link what `transfer_s` uses, for
    any sites the nodes declare (not only consistent ones). Kept in the
    context's memo (`of`).
    """

    def __init__(self, ctx: ClusterContext) -> None:
        import numpy as np

        self.index = {n.name: k for k, n in enumerate(ctx.nodes)}
        sites = {s: k for k, s in enumerate(sorted({n.spec.site for n in ctx.nodes}))}
        specs = [n.spec for n in ctx.nodes]
        self.site = np.array([sites[s.site] for s in specs], dtype=np.int64)
        self.intra_lat = np.array([s.intra_site_latency_ms / 1000.0 for s in specs])
        self.intra_bw = np.array([s.intra_site_bandwidth_mbps * 1e6 for s in specs])
        shape = (len(specs), len(sites))
        self.declared = np.zeros(shape, dtype=np.bool_)
        self.out_lat = np.full(shape, DEFAULT_LINK[0])
        self.out_bw = np.full(shape, DEFAULT_LINK[1])
        for k, spec in enumerate(specs):
            for lk in spec.links:
                s = sites.get(lk.site)
                if s is None or self.declared[k, s]:  # no node there, or not the first
                    continue
                self.declared[k, s] = True
                self.out_lat[k, s] = lk.latency_ms / 1000.0
                self.out_bw[k, s] = lk.bandwidth_mbps * 1e6

    @property
    def arrays(self) -> tuple[Any, ...]:
        """(site, intra_lat, intra_bw, declared, out_lat, out_bw), as compiled code takes them."""
        return self.site, self.intra_lat, self.intra_bw, self.declared, self.out_lat, self.out_bw

    def from_node(self, o: int, dests: list[int]) -> tuple[Any, Any]:
        """(one-way latency s, bandwidth bit/s) from position `o` to each of `dests`."""
        import numpy as np

        d = np.asarray(dests, dtype=np.int64)
        site_d, site_o = self.site[d], self.site[o]
        own = self.declared[o, site_d]
        theirs = self.declared[d, site_o]
        lat = np.where(
            own, self.out_lat[o, site_d], np.where(theirs, self.out_lat[d, site_o], DEFAULT_LINK[0])
        )
        bw = np.where(
            own, self.out_bw[o, site_d], np.where(theirs, self.out_bw[d, site_o], DEFAULT_LINK[1])
        )
        same = site_d == site_o
        lat[same], bw[same] = self.intra_lat[o], self.intra_bw[o]
        lat[d == o], bw[d == o] = 0.0, np.inf
        return lat, bw

    @classmethod
    def of(cls, ctx: ClusterContext) -> NodeLinks:
        """The context's tables, built on first use."""
        return memoized(ctx, "estimates.node_links", lambda: cls(ctx))


def memoized(ctx: ClusterContext, key: str, build: Callable[[], T]) -> T:
    """`build()`, kept in the context's memo under `key` (namespaced by module)."""
    hit = ctx.memo.get(key)
    if hit is None:
        hit = ctx.memo[key] = build()
    return cast(T, hit)
