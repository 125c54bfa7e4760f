"""Per-candidate features of one routing decision: the actor's input, the same for any cluster.

The actor scores each candidate server of a batch from that candidate's row
alone (shared weights), so a policy trained on 8 servers decides on 3 or 30.
A row is the sequence-MDP state seen from one candidate: the server's
capability and dynamic status (KV-cache usage, running and waiting sequences,
backlog, workload deviation W_s - mean W, virtual queue Z_s), the router's
estimate of the batch's latency there and its Lyapunov balance term, and the
batch's size. Scales are fixed (log1p of counts, shares in 0..1), so the
policy file needs no normalizer. `ppo-fixed` sees no virtual queue: its Z and
balance columns are zero.

Not here: the scores themselves (`actor`), and the Lyapunov terms, which the
router computes (`Candidate`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from lmedge.api import NodeState, SlotObservation
from lmedge.policies.lyreo.router import Candidate, workload

#: Column names, in order (the policy file records them; a file whose names differ is refused).
FEATURES: tuple[str, ...] = (
    "latency_over_deadline",
    "balance",
    "z",
    "mean_z",
    "deviation",
    "backlog",
    "kv_usage",
    "lm_kv_usage",
    "running",
    "waiting",
    "vram",
    "free_vram",
    "gpu_util",
    "lm_ready",
    "local",
    "batch_prompts",
)
WIDTH = len(FEATURES)
# The compiled kernel fills these columns by position.
assert FEATURES[0] == "latency_over_deadline" and FEATURES[1] == "balance"
assert FEATURES[14] == "local" and FEATURES[15] == "batch_prompts"
Array = np.ndarray[Any, Any]
#: Latency estimates past this many deadlines all read the same (a hopeless candidate).
LATENCY_CAP = 10.0


def _signed_log(x: float) -> float:
    return math.copysign(math.log1p(abs(x)), x)


class SlotFeatures:
    """The per-node part of the rows for one slot, computed once and reused by its batches.

    `loads` are the slot's W_s (the router's `workload`); `deviation(node)` is
    W_s - mean W, which `ppo-fixed` also prices in its cost.
    """

    def __init__(self, obs: SlotObservation, z: Mapping[str, float], use_z: bool) -> None:
        ctx = obs.context
        self.obs = obs
        self.use_z = use_z
        self.states: dict[str, NodeState] = {s.name: s for s in obs.snapshot.nodes}
        workers = [n.name for n in ctx.workers]
        for n in workers:
            self.states.setdefault(n, NodeState(name=n))
        self.loads = {n: workload(ctx, self.states[n]) for n in workers}
        self.mean_load = sum(self.loads.values()) / max(len(self.loads), 1)
        self.mean_z = sum(z.get(n, 0.0) for n in workers) / max(len(workers), 1)
        self.z = z
        self._matrix: tuple[dict[str, int], Array] | None = None
        self._index: dict[str, int] = {}
        self._lm_kv: dict[tuple[str, str], float] | None = None
        # compiled on first use (numba loads only when a learned router is built)
        from lmedge.policies.lyreo.learning import kernel

        self._kernel = kernel
        self._ready: set[tuple[str, str]] = set()
        self._lm: dict[str, tuple[Array, float]] = {}

    def deviation(self, node: str) -> float:
        return self.loads.get(node, self.mean_load) - self.mean_load

    def kv_usage(self, node: str, lm: str | None = None) -> float:
        """Highest KV-cache share in use on `node` (of `lm`'s engines only, when given)."""
        engines = self.states[node].engines or []
        return max(
            (e.kv_cache_usage or 0.0 for e in engines if lm is None or e.lm == lm), default=0.0
        )

    def _node_matrix(self) -> tuple[dict[str, int], np.ndarray[Any, Any]]:
        """Every worker's node columns (z, mean z, deviation, ..., gpu_util), built once a slot."""
        if self._matrix is None:
            ctx = self.obs.context
            names = list(self.loads)
            rows = []
            for node in names:
                state = self.states[node]
                engines = state.engines or []
                total_vram = ctx.node(node).spec.total_vram_gib
                rows.append(
                    [
                        math.log1p(self.z.get(node, 0.0)) if self.use_z else 0.0,
                        math.log1p(self.mean_z) if self.use_z else 0.0,
                        _signed_log(self.deviation(node)),
                        math.log1p(sum(max(q, 0) for q in state.backlog.values())),
                        self.kv_usage(node),
                        math.log1p(sum(e.running for e in engines)),
                        math.log1p(sum(e.waiting for e in engines)),
                        total_vram / 24.0,
                        state.free_vram_gib / total_vram if total_vram > 0 else 0.0,
                        state.gpu_util,
                    ]
                )
            self._matrix = ({n: i for i, n in enumerate(names)}, np.array(rows).reshape(-1, 10))
            self._index = self._matrix[0]
        return self._matrix

    def _template(self, lm: str) -> tuple[Array, float]:
        """(every worker's row for a batch of `lm`, batch columns zero; `lm`'s deadline)."""
        got = self._lm.get(lm)
        if got is None:
            index, matrix = self._node_matrix()
            if self._lm_kv is None:  # (node, LM) -> KV share / ready, for every LM at once
                self._lm_kv, self._ready = {}, set()
                for node in index:
                    state = self.states[node]
                    for e in state.engines or []:
                        key = (node, e.lm)
                        self._lm_kv[key] = max(self._lm_kv.get(key, 0.0), e.kv_cache_usage or 0.0)
                    self._ready.update((node, x.lm) for x in state.instances if x.status == "ready")
            out = np.zeros((len(index), WIDTH))
            out[:, 2:7] = matrix[:, 0:5]
            out[:, 8:13] = matrix[:, 5:10]
            out[:, 7] = [self._lm_kv.get((n, lm), 0.0) for n in index]
            out[:, 13] = [(n, lm) in self._ready for n in index]
            got = self._lm[lm] = (out, self.obs.context.deadline_s(lm))
        return got

    def _batch(
        self, b: int, cands: Sequence[Candidate]
    ) -> tuple[Array, Array, Array, int, float, float, bool, float]:
        """The kernel's arguments for batch `b` (`kernel.candidate_rows`, in order)."""
        a = self.obs.arrivals[b]
        template, deadline = self._template(a.lm)
        index = self._index
        return (
            template,
            np.array([index[c.node] for c in cands], dtype=np.int64),
            np.array([(c.latency_s, c.balance, c.score) for c in cands]).reshape(-1, 3),
            index.get(a.origin, -1),
            math.log1p(a.prompts),
            1.0 / deadline,
            self.use_z,
            LATENCY_CAP,
        )

    def rows(self, b: int, cands: Sequence[Candidate]) -> tuple[Array, Array]:
        """(the (len(cands), WIDTH) rows of batch `b`, True where a candidate is feasible).

        `b` indexes the slot's arrivals; a candidate is feasible when its score
        is finite (some mode can serve the LM there).
        """
        args = self._batch(b, cands)
        out = np.empty((len(cands), WIDTH))
        self._kernel.candidate_rows(*args, out)
        return out, np.isfinite(args[2][:, 2])

    def choose(self, b: int, cands: Sequence[Candidate], actor: Any) -> int:
        """The feasible candidate with `actor`'s highest logit (-1 if none): one compiled call."""
        (w1, b1), (w2, b2), (w3, b3) = actor.layers
        m = len(cands)
        return int(
            self._kernel.choose(
                *self._batch(b, cands),
                np.empty((m, WIDTH)),
                w1,
                b1,
                w2,
                b2,
                w3,
                b3,
                np.empty(m),
            )
        )
