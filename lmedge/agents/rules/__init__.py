"""Deterministic rule backends of the three agents (used without an LLM endpoint)."""
