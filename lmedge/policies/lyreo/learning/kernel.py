"""The actor's per-decision work, compiled: the MLP's logits over a request's candidate rows.

A slot of a few hundred requests is a few hundred decisions over a handful of
candidates each; as numpy calls on such small arrays the forward pass alone
was several calls a decision. Compiled, it is one. The formula is `actor`'s
(the MLP: tanh, tanh, linear), term for term.
"""

from __future__ import annotations

import numpy as np

from lmedge.policies.compiled import Array, compiled


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
