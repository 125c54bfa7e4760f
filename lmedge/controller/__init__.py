"""lmedge.controller."""
