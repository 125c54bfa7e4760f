"""lmedge.dataplane."""
