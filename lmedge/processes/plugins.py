"""Fills this process's plugin catalog with lmedge's own plugins and profiles.

The catalog (`lmedge.controller.catalog`) does not fill itself: every
composition root that builds a policy (the controller, a node agent, the
emulated runs of `simulate`/`bench`/`calibrate`, a worker of a run pool)
calls `register_plugins()` before the first plugin is built. The families
and profiles themselves are listed in `lmedge.controller.registrations`.
"""

from __future__ import annotations

from lmedge.controller import catalog, registrations

__all__ = ["register_plugins"]


def register_plugins() -> None:
    """Register every in-tree plugin family and profile in this process's catalog.

    Idempotent and thread-safe: the first call fills the catalog, later ones
    return at once; a family whose import fails is left out and named in
    `catalog.UNAVAILABLE` (see `catalog.register`).
    """
    catalog.register(registrations.FAMILIES, registrations.register_profiles)
