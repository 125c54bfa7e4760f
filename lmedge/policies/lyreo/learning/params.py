"""The learner's hyperparameters: one pydantic model, validated when a run or a training starts.

Defaults are the seed's where it gives them (LSTM 2 x 64, truncation H = 250,
epsilon and nu as the router's) and common PPO settings elsewhere
(assumptions, marked as such). The residual actor (`residual`, `temperature`)
and the validation that picks the shipped checkpoint (`validate_every`) are
lmedge's additions to the seed's method (`lmedge/policies/lyreo/README.md`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from lmedge.policies.kit.params import PluginParams

#: The three learned schedulers of the seed's comparison:
#: `lyreo`: PPO on rewards redistributed by the LSTM return predictor, with the virtual queues;
#: `ly-ppo`: the same PPO on the delayed rewards as observed (no redistribution);
#: `ppo-fixed`: no virtual queue: a fixed penalty on the chosen node's workload deviation.
Variant = Literal["lyreo", "ly-ppo", "ppo-fixed"]


class LearnerParams(PluginParams):
    """PPO, return predictor and reward settings of one training (`lmedge train lyreo`)."""

    variant: Variant = Field(default="lyreo", description="Which learned scheduler to train.")
    nu: float = Field(default=0.5, ge=0, description="Weight of latency against balance.")
    epsilon: float = Field(default=0.01, ge=0, description="Tolerated workload deviation.")
    fixed_penalty: float = Field(
        default=1.0,
        ge=0,
        description="ppo-fixed only: weight of (W_s - mean W) of the chosen node in the cost.",
    )
    memory_penalty: float = Field(
        default=1.0,
        ge=0,
        description="Cost per 10% of KV cache in use above 90% on the chosen node (feasibility).",
    )
    horizon: int = Field(
        default=250, ge=2, description="H: decisions per return-predictor window (seed: 250)."
    )
    lstm_hidden: int = Field(default=64, ge=1, description="Return predictor width (seed: 64).")
    lstm_layers: int = Field(default=2, ge=1, description="Return predictor depth (seed: 2).")
    predictor_epochs: int = Field(default=4, ge=1, description="LSTM passes per episode.")
    hidden: int = Field(default=32, ge=1, description="Actor and critic hidden width.")
    gamma: float = Field(default=0.99, gt=0, le=1, description="Discount per decision.")
    gae_lambda: float = Field(default=0.95, ge=0, le=1, description="GAE lambda.")
    clip: float = Field(default=0.2, gt=0, lt=1, description="PPO surrogate clip.")
    lr: float = Field(default=3e-4, gt=0, le=1, description="Adam learning rate.")
    ppo_epochs: int = Field(default=4, ge=1, description="PPO passes over an episode.")
    minibatch: int = Field(default=256, ge=1, description="Decisions per PPO minibatch.")
    entropy: float = Field(default=0.01, ge=0, description="Entropy bonus weight.")
    value_coef: float = Field(default=0.5, ge=0, description="Critic loss weight.")
    residual: bool = Field(
        default=True,
        description="Residual actor: logits = -(greedy score)/temperature + MLP(row), the MLP's "
        "last layer zero at the start, so the untrained argmax is the variant's greedy "
        "(lyreo-ly; ppo-fixed: its fixed-penalty greedy). False: the MLP alone.",
    )
    temperature: float = Field(
        default=0.005,
        gt=0,
        description="Residual actor: the greedy score's temperature (score units: a latency of "
        "one deadline weighs nu). Lower: the sampled policy stays closer to the greedy.",
    )
    validate_every: int = Field(
        default=5,
        ge=0,
        description="Evaluate the argmax on the validation seeds before training and every this "
        "many episodes, and keep the checkpoint of lowest validation cost; 0: keep the last.",
    )
    validate_seeds: tuple[int, ...] = Field(
        default=(11, 12),
        description="Emulator seeds of the validation runs (not training seeds).",
    )

    @field_validator("validate_seeds", mode="before")
    @classmethod
    def _seeds_from_text(cls, value: object) -> object:
        # `--param validate_seeds=11,12` arrives as text
        if isinstance(value, str):
            return tuple(x.strip() for x in value.split(",") if x.strip())
        return value

    @model_validator(mode="after")
    def _penalty_for_variant(self) -> LearnerParams:
        default = type(self).model_fields["fixed_penalty"].default
        if self.variant != "ppo-fixed" and self.fixed_penalty != default:
            raise ValueError(
                "fixed_penalty applies to variant ppo-fixed only (the others use virtual queues)"
            )
        return self
