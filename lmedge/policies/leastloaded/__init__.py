"""Global least-loaded routing per request (LYREO's Least-Loaded baseline)."""

from lmedge.policies.leastloaded.router import LeastLoadedParams, LeastLoadedRouter, build

__all__ = ["LeastLoadedParams", "LeastLoadedRouter", "build"]
