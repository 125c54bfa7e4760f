"""The one place policies compile Python with numba (the LYREO and CEMA kernels).

Importing numba costs about a second, so only the kernels import this module,
and only when a profile that needs them is built (an import-linter contract
holds the rest of lmedge to that).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, cast

import numpy as np
from numba import njit

Array = np.ndarray[Any, Any]
F = TypeVar("F", bound=Callable[..., Any])

# IEEE division (x / inf = 0, x / 0 = inf) instead of Python's ZeroDivisionError
# check, whose branch also keeps the loops from vectorizing.
_OPTIONS: dict[str, Any] = {"nogil": True, "error_model": "numpy"}


def compiled(fn: F) -> F:
    """`njit`, its machine code cached on disk when a cache directory is writable.

    Without one (a read-only root file system with no NUMBA_CACHE_DIR), each
    process compiles the kernel on first use instead: a second or two.
    """
    return _jit(fn, _OPTIONS)


def inlined(fn: F) -> F:
    """`compiled`, and inlined into its callers by numba itself.

    For the small helpers that take a named tuple of arrays: called, each
    array of the tuple is passed by value (several words each), which costs
    more than the helper's own work.
    """
    return _jit(fn, {**_OPTIONS, "inline": "always"})


def _jit(fn: F, options: dict[str, Any]) -> F:
    try:
        return cast(F, njit(cache=True, **options)(fn))
    except RuntimeError:  # numba: "cannot cache function ...: no locator available"
        return cast(F, njit(**options)(fn))
