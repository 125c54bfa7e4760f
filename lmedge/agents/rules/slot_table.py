"""The rule scheduler's candidate costs as arrays, built once per slot.

`candidates()` (scheduler.py) ranks every feasible node for one (origin, LM)
pair in Python: at 1,000 workers x 16 LMs x ~14,000 pairs a slot that is
~14 million candidate objects and two minutes per slot. Within one slot
only two things change from pair to pair: the prompts already sent to each
node (`extra`) and the origin (the uplink transfer). Everything else -- each
node's status, service rate, wait and macro weight -- is fixed for the slot,
so `SlotTable` computes it once per LM into numpy columns, and `assign`
routes the LM's pairs over them in one compiled loop (routing_kernel.py).

The arithmetic is the same expressions in the same order as `candidates()`
(IEEE float64 either way), and ties are broken by the same key
(cost, -weight, not the origin, name), so the routing map is identical; the
unit tests compare the two on random clusters. The usable tier (planned
nodes, else draining ones, else the inactive-target conflicts) is fixed per
slot too, so only that tier's nodes are priced.

What a pair still costs is one pass over the LM's site groups: each
candidate's queue term `backlog / rate + wait` is kept per candidate and
re-priced only where a pair is added, the uplink seconds are one row per
(origin link table, prompts) over the sites and `prompts / rate` one row per
prompt count, and the columns are in (-weight, name) order, so the first of
the cheapest is already the weight-then-name tie-break (weights are fixed
for the slot) and only the origin's own node needs a scalar check.
A pair of an LM whose every candidate already has a queue ending past the
admission horizon is refused without pricing: the transfer is never
negative, so `backlog / rate + wait + prompts / rate` bounds every pair's
cost from below, whatever its origin, and backlogs only grow within a slot,
so the bound (kept per prompt count) stays valid as prompts are routed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from lmedge.agents.rules.capacity import best_rate, instance_rate
from lmedge.api import ClusterContext, InstanceState, NodeState
from lmedge.api.constants import COLD_START_S

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
    base: Floats  # backlog / rate + wait, kept in step with `backlog` by `add`
    # Scalars are read and written as Python lists: a scalar access of a numpy
    # array costs ten times a list's, and `add` does a few per pair.
    backlog: list[int]  # snapshot backlog + prompts routed there this slot (updated by `add`)
    base_list: list[float]  # `base` as a list
    rate_list: list[float]
    wait: list[float]
    weight: list[float]
    off: bool  # the tier is the inactive-target conflicts: cost 2 tau, start tau
    tau: float
    idle: int  # candidates with no backlog (a choice among them is never refused)
    per: dict[int, Floats]  # prompts -> prompts / rate
    floor: dict[int, float]  # prompts -> a lower bound of any pair's cost (refusals)


class Pick(NamedTuple):
    """The cheapest candidate of a pair: the first element of `candidates()`'s usable list."""

    column: int  # the position in the LM's columns
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
        self._by_lm: dict[str, dict[str, InstanceState]] | None = None
        self._by_role: dict[str, list[str]] | None = None
        self._lms: dict[str, LmColumns | None] = {}
        # What depends on the context alone is kept with it, across slots (at 1,000
        # workers, rebuilding every origin's link arrays each slot was ~50 ms, and
        # each LM's feasible set, sites and best rates ~40 ms more).
        memo = ctx.memo
        if "slot_table.sites" not in memo:
            sites = sorted({n.spec.site for n in ctx.nodes})
            index = {s: i for i, s in enumerate(sites)}
            memo["slot_table.sites"] = (sites, {n.name: index[n.spec.site] for n in ctx.nodes})
        self.sites, self._site_of = memo["slot_table.sites"]
        self._static: dict[str, tuple[list[str], set[str], dict[str, float]]] = memo.setdefault(
            "slot_table.lms", {}
        )
        links = memo.setdefault("slot_table.links", ({}, {}, {}))
        self._links: dict[str, tuple[Floats, Floats]] = links[0]
        # link tables interned: origins with equal tables share cached uplink columns
        self._link_ids: dict[bytes, int] = links[1]
        self._origin_link: dict[str, int] = links[2]
        # Each LM's planned tier in (-weight, name) order depends on the macro
        # policy alone (and the context), so it is kept until the plan changes
        # (once an epoch, or on a re-plan); only its instances and backlogs are
        # read each slot. At 10,000 workers sorting it every slot was ~0.3 s.
        order = memo.get("slot_table.order")
        if order is None or order[0] != weights or order[1] != roles:
            order = memo["slot_table.order"] = (weights, roles, {})
        self._order: dict[str, tuple[list[tuple[str, float]], set[str]]] = order[2]

    def _instances(self, lm: str) -> dict[str, InstanceState]:
        """`lm`'s instance on each node that runs one (the first, as `NodeState.instance`)."""
        if self._by_lm is None:
            by_lm: dict[str, dict[str, InstanceState]] = {}
            for name, st in self._states.items():
                for inst in st.instances:
                    by_lm.setdefault(inst.lm, {}).setdefault(name, inst)
            self._by_lm = by_lm
        return self._by_lm.get(lm, {})

    def _role_nodes(self) -> dict[str, list[str]]:
        """The nodes each LM has a role on (the plan's roles, inverted once a slot)."""
        if self._by_role is None:
            by_role: dict[str, list[str]] = {}
            for n, lms in self._roles.items():
                for lm in lms:
                    by_role.setdefault(lm, []).append(n)
            self._by_role = by_role
        return self._by_role

    def _lm_static(self, lm: str) -> tuple[list[str], set[str], dict[str, float]]:
        """`lm`'s feasible nodes (list and set) and each one's best rate (the context's alone)."""
        got = self._static.get(lm)
        if got is None:
            ctx = self.ctx
            svc = ctx.service(lm).spec
            feasible = ctx.feasible_nodes(lm)
            rates = {n: best_rate(svc, ctx.node(n).spec) for n in feasible}
            got = self._static[lm] = (feasible, set(feasible), rates)
        return got

    def columns(self, lm: str) -> LmColumns | None:
        """The usable tier of `lm`'s candidates, or None when it has none."""
        if lm not in self._lms:
            self._lms[lm] = self._build(lm)
        return self._lms[lm]

    def _planned(self, lm: str) -> tuple[list[tuple[str, float]], set[str]]:
        """`lm`'s planned nodes with their weights in (-weight, name) order, and as a set.

        Planned: the nodes the plan gives `lm` weight on or a role on, among its
        feasible ones; all feasible nodes when there are none.
        """
        got = self._order.get(lm)
        if got is None:
            weights = self._weights.get(lm, {})
            _, feasible_set, _ = self._lm_static(lm)
            planned = {n for n, w in weights.items() if w > 0 and n in feasible_set}
            planned.update(n for n in self._role_nodes().get(lm, ()) if n in feasible_set)
            if not planned:
                planned = feasible_set
            ranked = sorted(((n, weights.get(n, 0.0)) for n in planned), key=_rank)
            got = self._order[lm] = (ranked, planned)
        return got

    def _build(self, lm: str) -> LmColumns | None:
        ctx = self.ctx
        weights = self._weights.get(lm, {})
        feasible, feasible_set, best = self._lm_static(lm)
        insts = self._instances(lm)
        ranked, planned = self._planned(lm)
        svc = ctx.service(lm).spec
        # tier 0: ready, pending, role (planned); tier 1: draining (running, not
        # planned); tier 2: off (neither; see LAST_RESORT). Only the first
        # non-empty tier is priced, so the later ones are listed only when needed.
        # The columns are in (-weight, name) order: the first of equal costs wins
        # the weight, then the name, tie. The planned tier comes in that order.
        rows: list[tuple[str, float, float, float]] = []
        for n, w in ranked:
            inst = insts.get(n)
            if inst is not None:
                rate = instance_rate(svc, ctx.node(n).spec, inst)
                wait = COLD_START_S / 2 if inst.status == "pending" else 0.0
            else:
                rate, wait = best[n], COLD_START_S
            if rate > 0:
                rows.append((n, rate, wait, w))
        off = False
        if not rows:
            for n, inst in insts.items():
                if n in feasible_set and n not in planned:
                    rate = instance_rate(svc, ctx.node(n).spec, inst)
                    wait = COLD_START_S / 2 if inst.status == "pending" else 0.0
                    if rate > 0:
                        rows.append((n, rate, wait, weights.get(n, 0.0)))
            if not rows:
                rows = [(n, 0.0, 0.0, 0.0) for n in feasible if n not in insts and n not in planned]
                off = True
            if not rows:
                return None
            rows.sort(key=lambda r: _rank((r[0], r[3])))
        names = [r[0] for r in rows]
        backlog = []
        for n in names:
            st = self._states.get(n)
            backlog.append(st.backlog.get(lm, 0) if st else 0)
        rates = np.array([r[1] for r in rows], np.float64)
        waits = np.array([r[2] for r in rows], np.float64)
        counts = np.array(backlog, np.int64)
        base = counts / rates + waits
        site_of = self._site_of
        return LmColumns(
            nodes=names,
            position={n: i for i, n in enumerate(names)},
            site=np.array([site_of[n] for n in names], np.intp),
            rate=rates,
            base=base,
            backlog=backlog,
            base_list=base.tolist(),
            rate_list=rates.tolist(),
            wait=waits.tolist(),
            weight=[r[3] for r in rows],
            off=off,
            tau=ctx.deadline_s(lm),
            idle=int(np.count_nonzero(counts == 0)),
            per={},
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

    @staticmethod
    def _pick_off(cols: LmColumns, origin: str) -> Pick:
        """The inactive-target tier: every candidate costs 2 tau and weighs nothing,
        so the origin's own node wins, else the first name."""
        j = cols.position.get(origin, 0)
        return Pick(j, cols.nodes[j], 2 * cols.tau, cols.backlog[j])

    def assign(
        self,
        cols: LmColumns,
        origins: list[str],
        prompts: list[int],
        request_kib: float,
        horizon: float | None,
    ) -> list[int]:
        """Route one LM's pairs in order: the column each goes to, or -1 when refused.

        Pair k comes from `origins[k]` with `prompts[k]` prompts (priced as at
        least one), in routing order.
        A pair is refused when the cheapest candidate has a queue and costs
        more than `horizon` (the module docstring says how a whole LM's pairs
        are refused without pricing); the loop is routing_kernel.py's.
        """
        out = [-1] * len(origins)
        if cols.off:
            for k, origin in enumerate(origins):
                got = self._pick_off(cols, origin)
                if horizon is None or got.backlog == 0 or got.cost_s <= horizon:
                    self.add(cols, got.column, prompts[k])
                    out[k] = got.column
            return out
        # Lazily: compiling (or loading the cached kernel) takes a second or so.
        from lmedge.agents.rules.routing_kernel import assign_pairs

        has_node, position, link_id = self.ctx.has_node, cols.position, self._link_id
        rows: dict[tuple[int, int], int] = {}  # (link table id, prompts) -> transfer row
        priced = [max(1, p) for p in prompts]
        row: list[int] = []
        own: list[int] = []
        floor_of: list[int] = []
        counts: dict[int, int] = {}  # prompts priced -> its row of `pers` and slot in `floors`
        for origin, p in zip(origins, priced, strict=True):
            floor_of.append(counts.setdefault(p, len(counts)))
            if has_node(origin):
                row.append(rows.setdefault((link_id(origin), p), len(rows)))
                own.append(position.get(origin, -1))
            else:
                row.append(-1)
                own.append(-1)
        transfers = self._transfer_rows(list(rows), request_kib)
        backlog = np.array(cols.backlog, np.int64)
        floors = np.full(len(counts), np.nan)
        for p, f in counts.items():
            if p in cols.floor:
                floors[f] = cols.floor[p]
        chosen = np.empty(len(origins), np.int64)
        cols.idle = assign_pairs(
            cols.base,
            backlog,
            cols.rate,
            np.array(cols.wait, np.float64),
            np.array(cols.weight, np.float64),
            cols.site,
            transfers,
            np.array(row, np.int64),
            np.array(own, np.int64),
            np.array(prompts, np.int64),
            np.array(floor_of, np.int64),
            np.stack([self._per(cols, p) for p in counts]),
            floors,
            *self._site_groups(cols),
            horizon is not None,
            0.0 if horizon is None else horizon,
            cols.idle,
            chosen,
        )
        # the columns as `add` leaves them
        cols.backlog = backlog.tolist()
        cols.base_list = cols.base.tolist()
        for p, f in counts.items():
            if not np.isnan(floors[f]):
                cols.floor[p] = float(floors[f])
        return chosen.tolist()

    @staticmethod
    def _site_groups(cols: LmColumns) -> tuple[Ints, Ints, Ints, Ints]:
        """The candidates by site: each one's group, the members group by group, the
        groups' offsets into them and each group's site (routing_kernel.py)."""
        sites, group_of = np.unique(cols.site, return_inverse=True)
        members = np.argsort(group_of, kind="stable").astype(np.int64)
        offsets = np.searchsorted(group_of[members], np.arange(len(sites) + 1)).astype(np.int64)
        return group_of.astype(np.int64), members, offsets, sites.astype(np.int64)

    def _transfer_rows(self, keys: list[tuple[int, int]], request_kib: float) -> Floats:
        """Uplink seconds to each site for each (link table id, prompts), as `transfer_s`."""
        if not keys:
            return np.zeros((1, len(self.sites)), np.float64)
        tables = self._link_tables()
        out = np.empty((len(keys), len(self.sites)), np.float64)
        for i, (link, prompts) in enumerate(keys):
            lat, bw = tables[link]
            kib = request_kib * prompts
            out[i] = lat / 1000.0 + kib * 8.0 / 1024.0 / bw
        return out

    def _link_tables(self) -> dict[int, tuple[Floats, Floats]]:
        """Each interned link table by id (origins with equal tables share one)."""
        tables: dict[int, tuple[Floats, Floats]] = self.ctx.memo.setdefault(
            "slot_table.link_tables", {}
        )
        if len(tables) < len(self._link_ids):
            for origin, link in self._origin_link.items():
                if link not in tables:
                    tables[link] = self._links[origin]
        return tables

    @staticmethod
    def add(cols: LmColumns, index: int, prompts: int) -> None:
        """Count `prompts` routed to candidate `index` this slot."""
        backlog = cols.backlog[index]
        if backlog == 0 and prompts > 0:
            cols.idle -= 1
        backlog += prompts
        cols.backlog[index] = backlog
        base = backlog / cols.rate_list[index] + cols.wait[index]
        cols.base_list[index] = base
        cols.base[index] = base


def _rank(node: tuple[str, float]) -> tuple[float, str]:
    """The columns' order of a (node, weight): heaviest first, then by name."""
    return (-node[1], node[0])
