"""The learned LYREO routers: the Lyapunov router with a trained actor deciding each batch.

`lyreo`, `ly-ppo` and `ppo-fixed` are the same router with the policy of
their variant: by default the one shipped in the package
(`lmedge/policies/lyreo/trained/<variant>.json`), or the file named by the
router parameter `policy`. When the package ships none, the router is the
Lyapunov greedy (`lyreo-greedy`) and says so once per process, with the
command that trains one. `policy: none` asks for the greedy explicitly.

Not here: deciding (`learning.actor`), training (`lmedge train lyreo`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import Field

from lmedge.api import ClusterContext
from lmedge.policies.kit.params import parse_params
from lmedge.policies.lyreo.learning.actor import ActorLearner, load_policy, shipped_policy
from lmedge.policies.lyreo.learning.params import Variant
from lmedge.policies.lyreo.router import LyreoParams, LyreoRouter

log = logging.getLogger(__name__)
_told: set[str] = set()


class LearnedParams(LyreoParams):
    policy: str = Field(
        default="shipped",
        min_length=1,
        description="'shipped' (the package's policy), 'none' (the greedy) or a policy file path.",
    )


def _fallback(variant: Variant, path: Path) -> None:
    if variant not in _told:
        _told.add(variant)
        log.warning(
            "LYREO %s: no trained policy at %s; routing with the Lyapunov greedy (lyreo-greedy). "
            "Train one with `lmedge train lyreo -f SCENARIO --variant %s -o %s`, or pass "
            "`--router-param policy=FILE`",
            variant,
            path,
            variant,
            path,
        )


def build_learned(
    context: ClusterContext, seed: int, params: Mapping[str, Any], variant: Variant
) -> LyreoRouter:
    """The router of `variant` with its trained actor (or the greedy, as the module says)."""
    del seed
    p = parse_params(LearnedParams, params, variant)
    learner: ActorLearner | None = None
    if p.policy == "shipped":
        path = shipped_policy(variant)
        if path.is_file():
            learner = ActorLearner(load_policy(path))
        else:
            _fallback(variant, path)
    elif p.policy != "none":
        learner = ActorLearner(load_policy(Path(p.policy)))
    return LyreoRouter(context, LyreoParams(nu=p.nu, epsilon=p.epsilon), learner)
