"""Token-level serving: the continuous-batching engine core and request token lengths.

See README.md beside this package for the model, its formulas and choices.
"""

from lmedge.sim.tokens.batching import BatchingEngine, KVSample, TokenRequest

__all__ = ["BatchingEngine", "KVSample", "TokenRequest"]
