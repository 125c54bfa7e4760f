"""lmedge.nodeagent."""
