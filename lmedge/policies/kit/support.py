"""Small helpers the deterministic policies share.

Kept here, not in `lmedge.api`, because they encode policy choices (what
"nearest" means, how a role set is filled) rather than contracts. Which modes
an LM can run in is not a policy choice: it is `ClusterContext.modes`
(`lmedge.api.hosting`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lmedge.api import ClusterContext, LMPlacement
from lmedge.errors import ConfigError

#: Link classes, nearest first: the node itself, a node on the same site, a
#: node on a site with a declared link, and any other node.
SELF, SAME_SITE, LINKED_SITE, OTHER = 0, 1, 2, 3


def link_class(ctx: ClusterContext, origin: str, dest: str) -> int:
    """How far `dest` is from `origin` as a network class (lower is nearer)."""
    if origin == dest:
        return SELF
    if not ctx.has_node(origin):
        return OTHER
    a, b = ctx.node(origin).spec, ctx.node(dest).spec
    if a.site == b.site:
        return SAME_SITE
    if any(link.site == b.site for link in a.links):
        return LINKED_SITE
    return OTHER


def nearest_feasible_node(
    ctx: ClusterContext, origin: str, lm: str, feasible: list[str] | None = None
) -> str | None:
    """The origin when it can host `lm`, else the nearest feasible node by link class then name.

    `feasible` may pass `ctx.feasible_nodes(lm)` precomputed (it costs a scan of the nodes).
    """
    if feasible is None:
        feasible = ctx.feasible_nodes(lm)
    if not feasible:
        return None
    if origin in feasible:
        return origin
    return min(feasible, key=lambda n: (link_class(ctx, origin, n), n))


class NearestHosts:
    """`nearest_feasible_node` for many origins of one context, without a scan per origin.

    The nearest node by (link class, name) is the origin itself, else the
    first name among the feasible nodes of its site, else of its linked
    sites, else of all; so per LM the first feasible name of each site is
    kept once, and each origin costs a look at its own links only. (The scan
    per (origin, LM) pair was seconds per slot of local routing at 1,000
    nodes.) The tests compare the two.
    """

    def __init__(self, ctx: ClusterContext) -> None:
        self.ctx = ctx
        self._first: dict[str, tuple[set[str], dict[str, str], str | None]] = {}

    def _lm(self, lm: str) -> tuple[set[str], dict[str, str], str | None]:
        got = self._first.get(lm)
        if got is None:
            feasible = self.ctx.feasible_nodes(lm)
            first: dict[str, str] = {}
            for n in feasible:
                site = self.ctx.node(n).spec.site
                if site not in first or n < first[site]:
                    first[site] = n
            got = self._first[lm] = (set(feasible), first, min(feasible, default=None))
        return got

    def __call__(self, origin: str, lm: str) -> str | None:
        hosts, first, overall = self._lm(lm)
        if origin in hosts or overall is None:
            return origin if origin in hosts else None
        if not self.ctx.has_node(origin):
            return overall
        spec = self.ctx.node(origin).spec
        if spec.site in first:
            return first[spec.site]
        linked = [first[x.site] for x in spec.links if x.site in first]
        return min(linked) if linked else overall


class FeasibleNodes:
    """`ctx.feasible_nodes(lm)` memoised per LM, for plugins that ask every slot.

    The cluster context is static for a run, and the scan over all nodes per
    (origin, LM) pair dominated routing time on large clusters.
    """

    def __init__(self) -> None:
        self._ctx: ClusterContext | None = None
        self._cache: dict[str, list[str]] = {}

    def __call__(self, ctx: ClusterContext, lm: str) -> list[str]:
        if ctx is not self._ctx:
            self._ctx, self._cache = ctx, {}
        hit = self._cache.get(lm)
        if hit is None:
            hit = self._cache[lm] = ctx.feasible_nodes(lm) if ctx.has_service(lm) else []
        return hit


def fits_role(ctx: ClusterContext, node: str, lms: list[str]) -> bool:
    """Whether a role set fits the node concurrently (memory, vGPUs for GPU-only LMs).

    Mirrors the role-capacity rule of `lmedge.api.check_macro_policy`.
    """
    spec = ctx.node(node).spec
    mem = sum(ctx.service(lm).spec.deployment_memory_gib for lm in lms)
    gpu_only = sum(1 for lm in lms if ctx.service(lm).spec.runs_on == "gpu-only")
    return mem <= spec.memory_gib + 1e-9 and gpu_only <= spec.total_vgpus


def off(lm: str) -> LMPlacement:
    return LMPlacement(lm=lm, mode="off", cpu_cores=0, vgpus=0)


def weights_summing_to_one(raw: dict[str, float], digits: int = 6) -> dict[str, float]:
    """Normalise non-negative `raw` weights to sum to exactly 1 after rounding.

    Rounding keeps stored policies readable; the rounding residue goes to the
    largest weight so the sum stays within `lmedge.api.feasibility.SUM_TOLERANCE`.
    """
    total = sum(raw.values())
    if total <= 0:
        raw = dict.fromkeys(raw, 1.0)
        total = float(len(raw))
    out = {k: round(v / total, digits) for k, v in raw.items()}
    if out:
        top = max(out, key=lambda k: (out[k], k))
        out[top] = round(out[top] + 1.0 - sum(out.values()), digits)
    return out


def no_params(kind: str, name: str, params: Mapping[str, Any]) -> None:
    """Reject parameters given to a plugin that takes none (loudly, at build time)."""
    if params:
        keys = ", ".join(sorted(params))
        raise ConfigError(f"{kind} {name!r} takes no parameters; got: {keys}")
