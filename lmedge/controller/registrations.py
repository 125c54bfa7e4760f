"""Registers every plugin and profile with the catalog. One line per plugin."""

from __future__ import annotations

from lmedge.controller.catalog import Profile, add_deployer, add_planner, add_profile, add_router

__all__ = ["Profile", "add_deployer", "add_planner", "add_profile", "add_router"]

# --- deterministic baselines (lmedge.policies) --------------------------------

# --- agents (lmedge.agents) ---------------------------------------------------

# --- profiles -----------------------------------------------------------------
