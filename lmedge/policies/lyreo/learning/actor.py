"""A trained LYREO actor: its policy file, and deciding with it without torch.

The actor is a small MLP applied to each candidate server's feature row
(`features`) with shared weights; the candidate scores are its logits, and a
trained policy routes each request to the highest-scoring server. A residual
actor (`LearnerParams.residual`, the default) adds the variant's greedy
score to the MLP's output, logit_s = -score_s / temperature + MLP(row_s)
(`CandidateScorer`): the MLP learns a correction to `lyreo-ly`, and an
untrained one (last layer zero) routes exactly as `lyreo-ly`. Deciding
needs numpy only, so `--policy lyreo` works without the `lyreo` extra
(torch), which only `lmedge train lyreo` needs.

A policy file is one JSON document (`PolicyFile`): the weights, the feature
names they expect, the hyperparameters they were trained with, and the
provenance (scenario, seed, episodes, commit, training curve). JSON keeps it
readable and diffable; the actor is a few thousand numbers.

Not here: training (`lmedge.policies.lyreo.learning.ppo`, torch), and the
router that asks it (`lmedge.policies.lyreo.perrequest`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from lmedge.api import Arrival, RequestRecord
from lmedge.errors import ConfigError
from lmedge.policies.kit.requests import RequestSlot
from lmedge.policies.lyreo.learning.features import (
    FEATURES,
    greedy_scores,
    request_rows,
    static_columns,
)
from lmedge.policies.lyreo.learning.params import LearnerParams, Variant
from lmedge.policies.lyreo.perrequest import Terms

#: /2: the actor may be residual (`params.residual`); a /1 file is refused (retrain it).
FORMAT: Literal["lmedge-lyreo-policy/2"] = "lmedge-lyreo-policy/2"
#: Where the shipped policies live in the package: `<variant>.json`.
SHIPPED = Path(__file__).resolve().parent.parent / "trained"

Array = np.ndarray[Any, Any]


class Layer(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    weight: list[list[float]] = Field(description="(inputs, outputs)")
    bias: list[float]


class Episode(BaseModel):
    """One point of the training curve (requests of the measured slots)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    episode: int = Field(ge=0)
    seed: int
    mean_latency_s: float = Field(
        description="Mean end-to-end latency per prompt, timeouts at tau."
    )
    failure_share: float = Field(ge=0, le=1, description="Prompts that did not succeed.")
    mean_z: float = Field(ge=0, description="Mean virtual-queue length over slots and nodes.")
    mean_cost: float = Field(description="Mean cost per decision (what the learner minimizes).")
    decisions: int = Field(ge=0)


class Checkpoint(BaseModel):
    """The argmax of the actor after `episodes` updates on the validation seeds (their mean)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    episodes: int = Field(ge=0, description="Updates done (0: the untrained actor).")
    mean_latency_s: float
    failure_share: float = Field(ge=0, le=1)
    mean_z: float = Field(ge=0)
    mean_cost: float = Field(description="What selects the shipped checkpoint (lowest wins).")


class Provenance(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    scenario: str
    seed: int
    episodes: int = Field(ge=0)
    selected: int = Field(
        ge=0,
        description="Updates of the actor in this file: the validation's best checkpoint "
        "(`episodes` without validation).",
    )
    slots: int = Field(ge=1)
    commit: str = Field(description="git commit of the code that trained it ('unknown' if none).")
    lmedge_version: str


class PolicyFile(BaseModel):
    """A trained actor with what produced it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: Literal["lmedge-lyreo-policy/2"] = FORMAT
    variant: Variant
    features: list[str]
    params: LearnerParams
    actor: list[Layer] = Field(min_length=1)
    provenance: Provenance
    curve: list[Episode] = Field(default_factory=list)
    validation: list[Checkpoint] = Field(default_factory=list)

    @model_validator(mode="after")
    def _shapes(self) -> PolicyFile:
        if len(self.actor) != 3:
            raise ValueError(f"actor: 3 layers (two hidden), got {len(self.actor)}")
        inputs = len(self.features)
        for k, layer in enumerate(self.actor):
            rows = {len(r) for r in layer.weight}
            if len(layer.weight) != inputs or len(rows) != 1:
                raise ValueError(f"actor.{k}.weight: expected {inputs} rows of equal length")
            (outputs,) = rows
            if len(layer.bias) != outputs:
                raise ValueError(f"actor.{k}.bias: expected {outputs} values")
            inputs = outputs
        if inputs != 1:
            raise ValueError("actor: the last layer has one output (a logit)")
        return self


def save_policy(policy: PolicyFile, path: Path) -> None:
    """Write `policy` atomically (a reader never sees half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(policy.model_dump(mode="json"), indent=1) + "\n")
    tmp.replace(path)


def load_policy(path: Path) -> PolicyFile:
    """Read and check a policy file; `ConfigError` naming the file and the problem."""
    try:
        raw = json.loads(path.read_text())
    except OSError as exc:
        raise ConfigError(f"LYREO policy {path}: cannot read it: {exc.strerror}") from exc
    except json.JSONDecodeError as exc:
        raise ConfigError(f"LYREO policy {path}: not JSON: {exc}") from exc
    try:
        policy = PolicyFile.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '(file)'}: {e['msg']}" for e in exc.errors()
        )
        raise ConfigError(f"LYREO policy {path}: {problems}") from exc
    if tuple(policy.features) != FEATURES:
        raise ConfigError(
            f"LYREO policy {path}: trained on features {policy.features}, this lmedge computes "
            f"{list(FEATURES)}; retrain it with `lmedge train lyreo`"
        )
    return policy


def shipped_policy(variant: Variant) -> Path:
    """The path of the policy for `variant` shipped in the package (it may be missing)."""
    return SHIPPED / f"{variant}.json"


class NumpyActor:
    """The actor MLP: two tanh hidden layers, one logit per candidate row.

    Plain numpy: a request's rows are a handful of servers, so the forward pass
    is a few small products (~10 us), and deciding needs no compiler at start-up.
    """

    def __init__(self, layers: Sequence[tuple[Array, Array]]) -> None:
        if len(layers) != 3:
            raise ValueError(f"the actor has 3 layers (two hidden), got {len(layers)}")
        self.layers = [
            (np.ascontiguousarray(w, dtype=float), np.ascontiguousarray(b, dtype=float))
            for w, b in layers
        ]

    @classmethod
    def of(cls, policy: PolicyFile) -> NumpyActor:
        return cls([(np.array(x.weight), np.array(x.bias)) for x in policy.actor])

    def logits(self, rows: Array) -> Array:
        """tanh(tanh(rows w1 + b1) w2 + b2) w3 + b3, one logit a row."""
        (w1, b1), (w2, b2), (w3, b3) = self.layers
        h = np.tanh(rows @ w1 + b1)
        h = np.tanh(h @ w2 + b2)
        out: Array = (h @ w3 + b3)[:, 0]
        return out


class CandidateScorer:
    """One request's candidate rows and the actor's logits over them (module docstring).

    Keeps the slot's static columns between the requests of a slot. `prior`
    is -score / temperature of a residual actor (zeros otherwise): training
    adds it to the torch MLP's output exactly as here.
    """

    def __init__(self, actor: NumpyActor, params: LearnerParams) -> None:
        self.actor = actor
        self.p = params
        self._use_z = params.variant != "ppo-fixed"
        self._static: tuple[RequestSlot, Array] | None = None

    def __call__(self, slot: RequestSlot, tokens: int, terms: Terms) -> tuple[Array, Array, Array]:
        """(rows, prior, logits) of a request of `tokens` input tokens in `slot`."""
        if self._static is None or self._static[0] is not slot:
            self._static = (slot, static_columns(slot))
        rows = request_rows(slot, tokens, terms, slot.deadline_s, self._use_z, self._static[1])
        if self.p.residual:
            prior = -greedy_scores(terms, slot.deadline_s, self.p) / self.p.temperature
        else:
            prior = np.zeros(len(rows))
        return rows, prior, prior + self.actor.logits(rows)


class ActorLearner:
    """A trained actor behind the router's learner seam: it decides, it does not learn.

    Each request goes to the server with the highest logit (ties: the first,
    in the slot's server order).
    """

    def __init__(self, policy: PolicyFile) -> None:
        self.policy = policy
        self.score = CandidateScorer(NumpyActor.of(policy), policy.params)

    def decide(self, slot: RequestSlot, a: Arrival, tokens: int, terms: Terms) -> int:
        return int(np.argmax(self.score(slot, tokens, terms)[2]))

    def observe(self, records: Sequence[RequestRecord]) -> None:
        return None
