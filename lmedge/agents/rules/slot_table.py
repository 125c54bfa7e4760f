"""The rule scheduler's candidate costs as arrays, built once per slot.

`candidates()` (scheduler.py) ranks every feasible node for one (origin, LM)
pair in Python: at 1,000 workers x 16 LMs x ~14,000 pairs a slot that is
~14 million candidate objects and two minutes per slot. Within one slot
only two things change from pair to pair: the prompts already sent to each
node (`extra`) and the origin (the uplink transfer). Everything else -- each
node's status, service rate, wait and macro weight -- is fixed for the slot,
so `SlotTable` computes it once per LM into numpy columns, and `pick` prices
a pair with a handful of array operations.

The arithmetic is the same expressions in the same order as `candidates()`
(IEEE float64 either way), and ties are broken by the same key
(cost, -weight, not the origin, name), so the routing map is identical; the
unit tests compare the two on random clusters. The usable tier (planned
nodes, else draining ones, else the inactive-target conflicts) is fixed per
slot too, so only that tier's nodes are priced.

What a pick still costs is kept to a few array passes: each candidate's
queue term `backlog / rate + wait` is kept per candidate and re-priced
only where `add` changes it, the uplink column is cached per (origin link
table, prompts) and `prompts / rate` per prompt count, and the columns are
in name order, so the first of the cheapest is the name tie-break.
`surely_rejected` answers, without pricing, the many pairs of an LM whose
every candidate already has a queue ending past the admission horizon:
the transfer is never negative, so `backlog / rate + wait + prompts / rate`
bounds every pair's cost from below, whatever its origin, and backlogs
only grow within a slot, so the bound stays valid as prompts are routed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from lmedge.agents.rules.capacity import COLD_START_S, best_rate, instance_rate
from lmedge.api import ClusterContext, InstanceState, NodeState

#: Link assumed between two sites that declare none (as in `scheduler.transfer_s`).
NO_LINK = (100.0, 20.0)

Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]


@dataclass
class LmColumns:
    """The priced tier of one LM's candidates, in feasible-node order."""

    nodes: list[str]
    position: dict[str, int]
    site: npt.NDArray[np.intp]  # index into SlotTable.sites
    rate: Floats
    wait: Floats
    backlog: Ints  # snapshot backlog + prompts routed there this slot (updated by `add`)
    weight: Floats
    off: bool  # the tier is the inactive-target conflicts: cost 2 tau, start tau
    tau: float
    base: Floats  # backlog / rate + wait, kept in step with `backlog` by `add`
    neg_weight: Floats
    idle: int  # candidates with no backlog (a pick among them is never refused)
    per: dict[int, Floats]  # prompts -> prompts / rate
    transfers: dict[tuple[int, int], Floats]  # (link table id, prompts) -> uplink seconds
    floor: dict[int, float]  # prompts -> a lower bound of any pair's cost (`surely_rejected`)


@dataclass(frozen=True)
class Pick:
    """The cheapest candidate of a pair: the first element of `candidates()`'s usable list."""

    index: int
    node: str
    cost_s: float
    backlog: int


class SlotTable:
    """Per-LM candidate columns for one slot; see the module docstring."""

    def __init__(
        self,
        ctx: ClusterContext,
        weights: dict[str, dict[str, float]],
        roles: dict[str, set[str]],
        states: dict[str, NodeState],
    ) -> None:
        self.ctx = ctx
        self._weights = weights
        self._roles = roles
        self._states = states
        self._instances: dict[str, dict[str, InstanceState]] = {}
        self.sites = sorted({n.spec.site for n in ctx.nodes})
        self._site_index = {s: i for i, s in enumerate(self.sites)}
        self._lms: dict[str, LmColumns | None] = {}
        # What depends on the context alone is kept with it, across slots (at 1,000
        # workers, rebuilding every origin's link arrays each slot was ~50 ms).
        links = ctx.memo.setdefault("slot_table.links", ({}, {}, {}))
        self._links: dict[str, tuple[Floats, Floats]] = links[0]
        # link tables interned: origins with equal tables share cached uplink columns
        self._link_ids: dict[bytes, int] = links[1]
        self._origin_link: dict[str, int] = links[2]

    def _instance(self, node: str, lm: str) -> InstanceState | None:
        by_lm = self._instances.get(node)
        if by_lm is None:
            by_lm = {}
            st = self._states.get(node)
            for inst in st.instances if st else ():
                by_lm.setdefault(inst.lm, inst)  # the first, as NodeState.instance
            self._instances[node] = by_lm
        return by_lm.get(lm)

    def columns(self, lm: str) -> LmColumns | None:
        """The usable tier of `lm`'s candidates, or None when it has none."""
        if lm not in self._lms:
            self._lms[lm] = self._build(lm)
        return self._lms[lm]

    def _build(self, lm: str) -> LmColumns | None:
        ctx = self.ctx
        weights = self._weights.get(lm, {})
        feasible = ctx.feasible_nodes(lm)
        planned = {n for n in feasible if weights.get(n, 0.0) > 0 or lm in self._roles.get(n, ())}
        if not planned:
            planned = set(feasible)
        svc = ctx.service(lm).spec
        # tier 0: ready, pending, role; tier 1: draining; tier 2: off (see LAST_RESORT)
        tiers: tuple[list[tuple[str, float, float, float]], ...] = ([], [], [])
        for n in feasible:
            inst = self._instance(n, lm)
            if inst is None and n not in planned:
                tiers[2].append((n, 0.0, 0.0, 0.0))
                continue
            node = ctx.node(n).spec
            if inst is not None:
                rate = instance_rate(svc, node, inst)
                tier = 0 if n in planned else 1
                wait = COLD_START_S / 2 if inst.status == "pending" else 0.0
            else:
                rate, tier, wait = best_rate(svc, node), 0, COLD_START_S
            if rate <= 0:
                continue
            tiers[tier].append((n, rate, wait, weights.get(n, 0.0)))
        usable = next((k for k in range(3) if tiers[k]), None)
        if usable is None:
            return None
        rows = sorted(tiers[usable])  # name order: the first of equal costs wins the name tie
        names = [r[0] for r in rows]
        backlog = []
        for n in names:
            st = self._states.get(n)
            backlog.append(st.backlog.get(lm, 0) if st else 0)
        rates = np.array([r[1] for r in rows], np.float64)
        waits = np.array([r[2] for r in rows], np.float64)
        counts = np.array(backlog, np.int64)
        return LmColumns(
            nodes=names,
            position={n: i for i, n in enumerate(names)},
            site=np.array([self._site_index[ctx.node(n).spec.site] for n in names], np.intp),
            rate=rates,
            wait=waits,
            backlog=counts,
            weight=np.array([r[3] for r in rows], np.float64),
            off=usable == 2,
            tau=ctx.deadline_s(lm),
            base=counts / rates + waits,
            neg_weight=-np.array([r[3] for r in rows], np.float64),
            idle=int(np.count_nonzero(counts == 0)),
            per={},
            transfers={},
            floor={},
        )

    def _link_arrays(self, origin: str) -> tuple[Floats, Floats]:
        """(latency ms, bandwidth Mbit/s) from `origin` to each site, as `transfer_s` reads them."""
        if origin not in self._links:
            a = self.ctx.node(origin).spec
            lat = np.empty(len(self.sites), np.float64)
            bw = np.empty(len(self.sites), np.float64)
            declared: dict[str, tuple[float, float]] = {}
            for x in a.links:
                declared.setdefault(x.site, (x.bandwidth_mbps, x.latency_ms))  # the first
            for i, s in enumerate(self.sites):
                if s == a.site:
                    bw[i], lat[i] = a.intra_site_bandwidth_mbps, a.intra_site_latency_ms
                else:
                    bw[i], lat[i] = declared.get(s, NO_LINK)
            self._links[origin] = (lat, bw)
        return self._links[origin]

    def _link_id(self, origin: str) -> int:
        """The interned id of `origin`'s link table (equal tables, equal ids)."""
        got = self._origin_link.get(origin)
        if got is None:
            lat, bw = self._link_arrays(origin)
            got = self._link_ids.setdefault(lat.tobytes() + bw.tobytes(), len(self._link_ids))
            self._origin_link[origin] = got
        return got

    def _per(self, cols: LmColumns, prompts: int) -> Floats:
        per = cols.per.get(prompts)
        if per is None:
            per = cols.per[prompts] = prompts / cols.rate
        return per

    def surely_rejected(self, cols: LmColumns, prompts: int, horizon: float) -> bool:
        """True when every candidate has a queue and even the cheapest ends past `horizon`.

        Then `pick` would return a candidate with a backlog and a cost above
        `horizon` for any origin (the module docstring says why), so the pair
        is refused without pricing it. False means "price it".
        """
        if cols.off or cols.idle:
            return False
        floor = cols.floor.get(prompts)
        if floor is None:
            floor = cols.floor[prompts] = float((cols.base + self._per(cols, prompts)).min())
        return floor > horizon

    def pick(self, cols: LmColumns, origin: str, prompts: int, request_kib: float) -> Pick:
        """The cheapest candidate for `prompts` prompts from `origin` (ties as `candidates()`).

        Ties go to the higher weight, then the origin's own node, then the name.
        """
        if cols.off:
            # every candidate costs 2 tau and weighs nothing: the origin, else the first name
            j = cols.position.get(origin, 0)
            return Pick(j, cols.nodes[j], 2 * cols.tau, int(cols.backlog[j]))
        per = self._per(cols, prompts)
        own = None
        if self.ctx.has_node(origin):
            key = (self._link_id(origin), prompts)
            transfer = cols.transfers.get(key)
            if transfer is None:
                lat, bw = self._link_arrays(origin)
                kib = request_kib * prompts
                # per site, then per candidate: the same values as pricing each candidate
                transfer = cols.transfers[key] = (lat / 1000.0 + kib * 8.0 / 1024.0 / bw)[cols.site]
            cost = cols.base + transfer
            cost += per
            own = cols.position.get(origin)
            if own is not None:
                cost[own] = (cols.base[own] + 0.0) + per[own]  # no transfer to itself
        else:
            cost = cols.base + per
        j = int(cost.argmin())  # the first of the cheapest: the lowest name
        best = cost[j]
        tied = cost == best
        if np.count_nonzero(tied) > 1:
            # many nodes often tie (idle ones of one class): break ties in arrays
            neg = np.where(tied, cols.neg_weight, np.inf)
            top = neg == neg.min()
            j = own if own is not None and top[own] else int(top.argmax())
        return Pick(j, cols.nodes[j], float(best), int(cols.backlog[j]))

    @staticmethod
    def add(cols: LmColumns, index: int, prompts: int) -> None:
        """Count `prompts` routed to candidate `index` this slot."""
        if cols.backlog[index] == 0 and prompts > 0:
            cols.idle -= 1
        cols.backlog[index] += prompts
        cols.base[index] = cols.backlog[index] / cols.rate[index] + cols.wait[index]
