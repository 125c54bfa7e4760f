"""Router `uniform`: spread each LM's traffic over its feasible nodes (the paper's AL).

A routing map names one destination per (origin, LM) pair and slot, so the
spreading happens across pairs and slots with smooth weighted round-robin
(the nginx algorithm): per LM, every node's credit grows by its weight, the
node with the most credit (ties: name) is chosen and pays the total weight.
Over time node n receives a share w_n of the pairs, deterministically and
without RNG. Weights are the macro policy's for the LM when there is one,
restricted to feasible nodes, else uniform over the feasible nodes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from lmedge.api import Decision, Route, RoutingMap, SlotObservation
from lmedge.api.base import built
from lmedge.policies.kit.support import FeasibleNodes


class UniformRouter:
    """Smooth weighted round-robin per LM; see the module docstring.

    Credits are numpy arrays over each LM's feasible nodes and the macro
    weights are looked up once per LM and slot, not once per pair (at 1,000
    workers the per-pair dict rebuild dominated the slot). The additions and
    the tie-break are those of the scalar algorithm, so the choices are too.
    """

    name = "uniform"

    def __init__(self) -> None:
        self._credit: dict[str, tuple[dict[str, int], np.ndarray[Any, Any]]] = {}
        self._feasible = FeasibleNodes()

    def _columns(self, lm: str, feasible: list[str]) -> tuple[dict[str, int], np.ndarray[Any, Any]]:
        if lm not in self._credit:
            self._credit[lm] = ({n: i for i, n in enumerate(feasible)}, np.zeros(len(feasible)))
        return self._credit[lm]

    def route(self, obs: SlotObservation) -> Decision[RoutingMap]:
        ctx = obs.context
        routes: list[Route] = []
        macro_weights = obs.macro.weights() if obs.macro is not None else None
        # per LM this slot: its nodes in name order, their credits gathered in that
        # order (written back at the end), weights and the total; in name order the
        # first of the tied maxima (argmax) is the name tie-break
        per_lm: dict[str, _Slot | None] = {}
        for a in sorted(obs.arrivals, key=lambda a: (a.lm, a.origin)):
            if not ctx.has_service(a.lm):
                continue
            if a.lm not in per_lm:
                feasible = self._feasible(ctx, a.lm)
                weights = _weights(macro_weights, a.lm, feasible)
                index, credit = self._columns(a.lm, feasible)
                names = sorted(weights)
                idx = np.array([index[n] for n in names], dtype=np.intp)
                per_lm[a.lm] = (
                    _Slot(
                        names,
                        idx,
                        credit[idx],
                        np.array([weights[n] for n in names], dtype=np.float64),
                        sum(weights.values()),
                    )
                    if names
                    else None
                )
            lm = per_lm[a.lm]
            if lm is None:
                continue
            c = lm.credit
            c += lm.weight
            j = int(c.argmax())
            c[j] -= lm.total
            # trusted names (the context's and the arrivals'): no revalidation
            routes.append(
                built(
                    Route,
                    {"origin": a.origin, "lm": a.lm, "destination": lm.names[j], "model": None},
                )
            )
        for name, lm in per_lm.items():
            if lm is not None:
                self._columns(name, [])[1][lm.idx] = lm.credit
        return Decision[RoutingMap](
            agent="scheduler", policy=self.name, source="rule", value=RoutingMap(routes=routes)
        )


@dataclass
class _Slot:
    """One LM's round-robin state within a slot (see `UniformRouter.route`)."""

    names: list[str]  # in name order
    idx: np.ndarray[Any, Any]  # position of each name in the LM's persistent credit array
    credit: np.ndarray[Any, Any]
    weight: np.ndarray[Any, Any]
    total: float


def _weights(
    macro: dict[str, dict[str, float]] | None, lm: str, feasible: list[str]
) -> dict[str, float]:
    if macro is not None:
        w = macro.get(lm, {})
        chosen = {n: w.get(n, 0.0) for n in feasible if w.get(n, 0.0) > 0}
        if chosen:
            return chosen
    return dict.fromkeys(feasible, 1.0)
