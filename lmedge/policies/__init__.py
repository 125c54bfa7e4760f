"""lmedge.policies."""
