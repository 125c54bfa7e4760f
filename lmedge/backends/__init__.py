"""lmedge.backends."""
