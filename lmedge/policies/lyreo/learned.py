"""The learned LYREO routers: the per-request Lyapunov router with a trained actor deciding.

`lyreo`, `ly-ppo` and `ppo-fixed` are `lyreo-ly` (`perrequest`) with the
policy of their variant deciding each request: by default the one shipped in
the package (`lmedge/policies/lyreo/trained/<variant>.json`), or the file
named by the router parameter `policy`. When the package ships none, the
router is the Lyapunov greedy `lyreo-ly` and says so once per process, with
the command that trains one. `policy: none` asks for the greedy explicitly.

Not here: deciding (`learning.actor`), training (`lmedge train lyreo`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import Field

from lmedge.policies.kit.params import parse_params
from lmedge.policies.lyreo.learning.actor import ActorLearner, load_policy, shipped_policy
from lmedge.policies.lyreo.learning.params import Variant
from lmedge.policies.lyreo.perrequest import LyreoRequestParams, LyreoRequestRouter

log = logging.getLogger(__name__)
_told: set[str] = set()


class LearnedParams(LyreoRequestParams):
    policy: str = Field(
        default="shipped",
        min_length=1,
        description="'shipped' (the package's policy), 'none' (the greedy) or a policy file path.",
    )


def _fallback(variant: Variant, path: Path) -> None:
    if variant not in _told:
        _told.add(variant)
        log.warning(
            "LYREO %s: no trained policy at %s; routing with the Lyapunov greedy (lyreo-ly). "
            "Train one with `lmedge train lyreo -f SCENARIO --variant %s -o %s`, or pass "
            "`--router-param policy=FILE`",
            variant,
            path,
            variant,
            path,
        )


def build_learned(params: Mapping[str, Any], variant: Variant) -> LyreoRequestRouter:
    """The router of `variant` with its trained actor (or the greedy, as the module says)."""
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
    base = LyreoRequestParams.model_validate(p.model_dump(exclude={"policy"}))
    return LyreoRequestRouter(variant, base, learner)
