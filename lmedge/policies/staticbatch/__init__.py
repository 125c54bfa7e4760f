"""Static-batching scheduling per request (LYREO's Static baseline)."""

from lmedge.policies.staticbatch.router import StaticBatchRouter

__all__ = ["StaticBatchRouter"]
