"""lmedge.sim."""
