"""lmedge.operator."""
