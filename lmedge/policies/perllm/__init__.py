"""PerLLM's UCB routing bandit (`perllm-ucb`)."""

from lmedge.policies.perllm.router import NAME, PerLLMParams, PerLLMRouter, build, reward

__all__ = ["NAME", "PerLLMParams", "PerLLMRouter", "build", "reward"]
