"""Static-batching scheduling per request (LYREO's Static baseline)."""

from lmedge.policies.staticbatch.router import StaticBatchRouter, build

__all__ = ["StaticBatchRouter", "build"]
