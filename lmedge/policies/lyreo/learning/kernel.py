"""The actor's per-decision work, compiled: a batch's feature rows and the MLP's logits.

A slot of a few hundred requests is a few hundred decisions over a handful of
candidates each; as numpy calls on such small arrays each decision was ~30
calls and most of the 20-ms slot budget. Compiled, the rows and the forward
pass are one call each. The formulas are `features` (the row layout) and
`actor` (the MLP: tanh, tanh, linear), term for term.
"""

from __future__ import annotations

import numpy as np

from lmedge.policies.compiled import Array, compiled


@compiled
def candidate_rows(
    template: Array,
    at: Array,
    terms: Array,
    origin: int,
    prompts_log: float,
    inv_deadline: float,
    use_z: bool,
    cap: float,
    rows: Array,
) -> None:
    """Fill rows[:m] for candidates `at` (worker indices) from the LM's template and
    the batch's terms (latency, balance, score per candidate)."""
    width = template.shape[1]
    for i in range(at.size):
        src = template[at[i]]
        for k in range(width):
            rows[i, k] = src[k]
        lat = terms[i, 0] * inv_deadline
        rows[i, 0] = lat if lat < cap else cap  # NaN compares False: the cap
        bal = terms[i, 1]
        if use_z and np.isfinite(bal):
            rows[i, 1] = np.sign(bal) * np.log1p(abs(bal))
        else:
            rows[i, 1] = 0.0
        rows[i, 14] = 1.0 if at[i] == origin else 0.0
        rows[i, 15] = prompts_log


@compiled
def mlp(
    rows: Array,
    m: int,
    w1: Array,
    b1: Array,
    w2: Array,
    b2: Array,
    w3: Array,
    b3: Array,
    out: Array,
) -> None:
    """out[i] = tanh(tanh(rows[i] w1 + b1) w2 + b2) w3 + b3, for the first m rows.

    The products go to BLAS (numba's np.dot), the rest stays in one loop.
    """
    h1 = np.dot(rows[:m], w1)
    for i in range(m):
        for j in range(h1.shape[1]):
            h1[i, j] = np.tanh(h1[i, j] + b1[j])
    h2 = np.dot(h1, w2)
    for i in range(m):
        acc = b3[0]
        for j in range(h2.shape[1]):
            acc += np.tanh(h2[i, j] + b2[j]) * w3[j, 0]
        out[i] = acc


@compiled
def choose(
    template: Array,
    at: Array,
    terms: Array,
    origin: int,
    prompts_log: float,
    inv_deadline: float,
    use_z: bool,
    cap: float,
    rows: Array,
    w1: Array,
    b1: Array,
    w2: Array,
    b2: Array,
    w3: Array,
    b3: Array,
    logits: Array,
) -> int:
    """`candidate_rows`, `mlp`, then the feasible (finite-score) candidate with the
    highest logit, the first on ties; -1 when none is feasible."""
    m = at.size
    candidate_rows(template, at, terms, origin, prompts_log, inv_deadline, use_z, cap, rows)
    mlp(rows, m, w1, b1, w2, b2, w3, b3, logits)
    best, at_best = -np.inf, -1
    for i in range(m):
        if np.isfinite(terms[i, 2]) and (at_best < 0 or logits[i] > best):
            best, at_best = logits[i], i
    return at_best
