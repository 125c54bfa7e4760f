"""lmedge.agents."""
