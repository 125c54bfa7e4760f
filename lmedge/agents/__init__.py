"""The three agents of the paper's hierarchy, on an OpenAI-compatible LLM.

`AgenticPlanner` (tier 1, per epoch), `AgenticRouter` (tier 2 scheduler, per
slot) and `AgenticDeployer` (tier 2, per node and slot). Each asks its LLM
when an endpoint is configured (settings.py) and runs its deterministic rule
backend (rules/) otherwise; every call yields an audited `Decision`.
They see system telemetry only, never request content.
"""

from lmedge.agents.deployer import AgenticDeployer
from lmedge.agents.planner import AgenticPlanner
from lmedge.agents.scheduler import AgenticRouter
from lmedge.agents.settings import LLMSettings, resolve_settings

__all__ = ["AgenticDeployer", "AgenticPlanner", "AgenticRouter", "LLMSettings", "resolve_settings"]
