"""CEMA's BatchEvaluator: the normalized four-term cost of a whole-batch assignment.

Genes are the slot's nonempty (origin, request class) batches (the routing map
is per (origin, class) pair, so requests of one batch cannot be split); alleles
are the batch's legal destinations (node, model): every node that can host
every LM serving the class (`ClusterContext.models_for`; an LM name is served
by itself). For an assignment g:

    J(g) = wQ Q(g)/Q_ub + wC C(g)/C_ub + wE E(g)/E_ub + wT T(g)/T_ub

- Q: prompt-weighted mean quality loss 1 - q_hat(class, node, model), so a
  better model (its `quality` prior, then its observed success) lowers Q;
- C: monetary cost, busy seconds x the node's `power.costPerHour` / 3600;
- E: energy, busy seconds x busy power of the serving mode (per vGPU, or per
  core on CPU) + transfer seconds x `radio_watts`;
- T: batch completion time (makespan): max over genes of transfer + the
  destination's finish time, where a destination (node, LM) finishes after
  its backlog B_d (queued prompts x service time, + cold start when the LM is
  not running) and every batch assigned to it in this assignment.

Each `*_ub` is an upper bound of its term over all legal assignments (the
per-gene worst choice), so every normalized term lies in [0, 1].

The terms are computed by the compiled kernel (`kernel.py`) from flat
arrays: one row per destination, the links between nodes, one row per gene.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from lmedge.api import ClusterContext, PowerProfile, SlotObservation
from lmedge.api.base import built
from lmedge.api.constants import COLD_START_S
from lmedge.api.decisions import Route
from lmedge.policies.cema import kernel
from lmedge.policies.cema.quality import QualityPredictor
from lmedge.policies.kit.estimates import (
    NodeLinks,
    memoized,
    service_s,
)

Array = np.ndarray[Any, Any]


@dataclass(frozen=True)
class Weights:
    quality: float
    cost: float
    energy: float
    time: float


@dataclass(frozen=True)
class Gene:
    origin: str
    lm: str
    prompts: int


class Destinations:
    """Every (node, model) a request class could be sent to, for one context.

    A model's destinations are contiguous (`span`), in `feasible_nodes`
    order, so a class's alleles are its models' spans in `models_for` order.
    The per-destination values that the context alone decides (the node's
    price, the model's payload, both modes' service time and busy power) are
    kept in the context's memo (`of`).
    """

    def __init__(self, ctx: ClusterContext) -> None:
        links = NodeLinks.of(ctx)
        self.pairs: list[tuple[str, str]] = []  # (node, model)
        self.span: dict[str, tuple[int, int]] = {}
        for m in ctx.lm_names:
            start = len(self.pairs)
            self.pairs += [(n, m) for n in ctx.feasible_nodes(m)]
            self.span[m] = (start, len(self.pairs))
        self.index = {pair: d for d, pair in enumerate(self.pairs)}
        self.node = np.array([links.index[n] for n, _ in self.pairs], dtype=np.int64)
        power = {n.name: n.spec.power or PowerProfile() for n in ctx.nodes}
        rows: list[tuple[float, ...]] = []
        for n, m in self.pairs:
            spec, profile = ctx.service(m).spec, ctx.service(m).spec.profile
            p = power[n]
            modes = ctx.modes(n, m)
            fastest = modes[0] if modes else "off"
            rows.append(
                (
                    profile.request_kib + profile.response_kib,
                    p.cost_per_hour,
                    service_s(ctx, m, "gpu"),
                    service_s(ctx, m, "cpu"),
                    p.busy_watts_per_gpu,
                    p.busy_watts_per_core * spec.default_cpu_cores,
                    {"gpu": 0.0, "cpu": 1.0}.get(fastest, 2.0),
                )
            )
        table = np.array(rows, dtype=float).reshape(len(rows), 7)
        self.kib, self.price = table[:, 0].copy(), table[:, 1].copy()
        self.per_gpu, self.per_cpu = table[:, 2].copy(), table[:, 3].copy()
        self.watts_gpu, self.watts_cpu = table[:, 4].copy(), table[:, 5].copy()
        fastest_mode = table[:, 6]
        # an idle destination serves in the node's fastest mode ("off": no mode, inf)
        self.idle_per = np.where(
            fastest_mode == 0, self.per_gpu, np.where(fastest_mode == 1, self.per_cpu, np.inf)
        )
        self.idle_watts = np.where(fastest_mode == 0, self.watts_gpu, self.watts_cpu)
        self.recv_lat2 = 2 * links.out_lat

    @classmethod
    def of(cls, ctx: ClusterContext) -> Destinations:
        """The context's table, built on first use."""
        return memoized(ctx, "cema.destinations", lambda: cls(ctx))

    def alleles(self, ctx: ClusterContext, request_class: str) -> Array:
        """Destinations of a class, models in `models_for` order, each in its nodes' order."""
        spans = [range(*self.span[m]) for m in ctx.models_for(request_class) if m in self.span]
        return np.fromiter((d for r in spans for d in r), dtype=np.int64)


class BatchEvaluator:
    """The slot as the compiled kernel reads it (`slot`), with the bounds of each term."""

    def __init__(
        self,
        obs: SlotObservation,
        predictor: QualityPredictor,
        weights: Weights,
        radio_watts: float,
    ) -> None:
        ctx = obs.context
        table = Destinations.of(ctx)
        links = NodeLinks.of(ctx)
        self.weights = weights
        self.radio_watts = radio_watts
        self.dests = table.pairs
        classes: dict[str, Array] = {}
        self.genes: list[Gene] = []
        for a in obs.arrivals:
            if a.requests <= 0:
                continue
            alleles = classes.get(a.lm)
            if alleles is None:
                alleles = classes[a.lm] = table.alleles(ctx, a.lm)
            if len(alleles):
                self.genes.append(Gene(a.origin, a.lm, max(a.prompts, 1)))
        names = [c for c, alleles in classes.items() if len(alleles)]
        class_of = {c: k for k, c in enumerate(names)}
        per, watts, backlog = self._serving(obs, table, links)
        legal = np.zeros((len(names), len(self.dests)), dtype=np.bool_)
        loss = np.zeros((len(names), len(self.dests)))
        off = [0]
        for k, c in enumerate(names):
            alleles = classes[c]
            legal[k, alleles] = True
            loss[k, alleles] = _losses(predictor, c, [self.dests[d] for d in alleles.tolist()])
            off.append(off[-1] + len(alleles))
        prompts = sum(g.prompts for g in self.genes) or 1
        origins: dict[str, int] = {}
        rows = [origins.setdefault(g.origin, len(origins)) for g in self.genes]
        row_node = np.array([links.index.get(o, -1) for o in origins], dtype=np.int64)
        lat2, bw, row_site = kernel.link_table(row_node, *links.arrays)
        self.slot = kernel.Slot(
            cls=np.array([class_of[g.lm] for g in self.genes], dtype=np.int64),
            prompts=np.array([g.prompts for g in self.genes], dtype=float),
            weight=np.array([g.prompts / prompts for g in self.genes], dtype=float),
            row=np.array(rows, dtype=np.int64),
            node=table.node,
            dest_site=links.site[table.node],
            dest=np.column_stack((per, table.price, watts, table.kib)),
            backlog=backlog,
            off=np.array(off, dtype=np.int64),
            alleles=np.concatenate([classes[c] for c in names] or [np.empty(0, dtype=np.int64)]),
            legal=legal,
            loss=loss,
            row_node=row_node,
            row_site=row_site,
            lat2=lat2,
            bw=bw,
            recv_lat2=table.recv_lat2,
            recv_bw=links.out_bw,
            direct=kernel.NO_DIRECT,
        )
        self.bounds, self.seed = kernel.prepare(self.slot, radio_watts)
        self.q_ub, self.c_ub, self.e_ub, self.t_ub = self.bounds.tolist()
        self.weight_array = np.array([weights.quality, weights.cost, weights.energy, weights.time])

    @staticmethod
    def _serving(
        obs: SlotObservation, table: Destinations, links: NodeLinks
    ) -> tuple[Array, Array, Array]:
        """Per destination: seconds a prompt, busy watts, backlog seconds (`estimates.backlog_s`).

        A running LM serves in its (first) instance's mode, an idle one in the
        node's fastest; a node missing from the snapshot counts as GPU with no
        backlog.
        """
        per, watts = table.idle_per.copy(), table.idle_watts.copy()
        queue = np.zeros(len(per))
        running = np.zeros(len(per), dtype=np.bool_)
        present = np.zeros(len(links.site), dtype=np.bool_)
        index = table.index
        for state in obs.snapshot.nodes:
            if state.name in links.index:
                present[links.index[state.name]] = True
            for inst in state.instances:
                d = index.get((state.name, inst.lm))
                if d is None or running[d]:
                    continue
                running[d] = True
                gpu = inst.mode == "gpu"
                per[d] = table.per_gpu[d] if gpu else table.per_cpu[d]
                watts[d] = table.watts_gpu[d] if gpu else table.watts_cpu[d]
            for lm, q in state.backlog.items():
                d = index.get((state.name, lm))
                if d is not None:
                    queue[d] = q
        backlog = queue * per + np.where(running, 0.0, COLD_START_S)
        seen = present[table.node]
        return (
            np.where(seen, per, table.per_gpu),
            np.where(seen, watts, table.watts_gpu),
            np.where(seen, backlog, 0.0),
        )

    @property
    def legal(self) -> list[Array]:
        """Each gene's alleles (destination indices), in allele order."""
        s = self.slot
        return [s.alleles[s.off[c] : s.off[c + 1]] for c in s.cls.tolist()]

    def transfer(self, gene: int, dest: int) -> float:
        """Uplink + downlink seconds of a gene's batch to a destination."""
        return float(kernel.transfer(self.slot, gene, dest))

    def raw(self, chromosome: list[int]) -> tuple[float, float, float, float]:
        """(Q, C, E, T) of an assignment (a destination per gene)."""
        q, c, e, t = kernel.raw(self.slot, self.radio_watts, np.asarray(chromosome, np.int64))
        return float(q), float(c), float(e), float(t)

    def routes(self, chromosome: list[int]) -> list[Route]:
        """The chromosome as routes: each gene's (origin, class) to its destination, with
        the serving model named when it is not the class itself (trusted names: no revalidation)."""
        return [
            built(
                Route,
                {
                    "origin": g.origin,
                    "lm": g.lm,
                    "destination": self.dests[d][0],
                    "model": None if self.dests[d][1] == g.lm else self.dests[d][1],
                },
            )
            for g, d in zip(self.genes, chromosome, strict=True)
        ]

    def fitness(self, chromosome: list[int]) -> float:
        """J(g), lower is better."""
        values = kernel.raw(self.slot, self.radio_watts, np.asarray(chromosome, np.int64))
        return float(kernel.fitness(values, self.bounds, self.weight_array))


def _losses(predictor: QualityPredictor, request_class: str, dests: list[tuple[str, str]]) -> Any:
    """1 - q_hat(class, node, model) for each (node, model), in one call where it can."""
    many = getattr(predictor, "predict_many", None)
    if many is not None:
        return 1.0 - np.asarray(many(request_class, dests), dtype=float)
    return [1.0 - predictor.predict(request_class, n, m) for n, m in dests]
