"""The three agents of the paper's hierarchy, on an OpenAI-compatible LLM.

`AgenticPlanner` (tier 1, per epoch), `AgenticRouter` (tier 2 scheduler, per
slot) and `AgenticDeployer` (tier 2, per node and slot). Each asks its LLM
when an endpoint is configured (settings.py) and runs its deterministic rule
backend (rules/) otherwise; every call yields an audited `Decision`.
They see system telemetry only, never request content.

The agent classes are imported on first use: they pull in the `openai` SDK,
which every `lmedge` command would otherwise pay for at start-up.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from lmedge.agents.settings import LLMSettings, resolve_settings

if TYPE_CHECKING:
    from lmedge.agents.deployer import AgenticDeployer
    from lmedge.agents.planner import AgenticPlanner
    from lmedge.agents.scheduler import AgenticRouter

_LAZY = {
    "AgenticDeployer": "lmedge.agents.deployer",
    "AgenticPlanner": "lmedge.agents.planner",
    "AgenticRouter": "lmedge.agents.scheduler",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["AgenticDeployer", "AgenticPlanner", "AgenticRouter", "LLMSettings", "resolve_settings"]
