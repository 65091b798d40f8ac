"""One config object per algorithm, validated at construction.

Every algorithm shares the clipped policy-gradient loss options (`PolicyLossConfig`) and adds its
advantage estimator's own. Unknown options are errors (`extra="forbid"`), so `GRPO(lam=0.95)` fails
instead of being ignored: GRPO has no GAE.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

from reinforge.errors import InvalidRequestError

LossAggregation = Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"]


class PolicyLossConfig(BaseModel):
    """The clipped policy-gradient loss, shared by every algorithm.

    Attributes:
        clip_eps_low: PPO clip range below 1: the ratio is clipped to [1 - clip_eps_low, ...].
        clip_eps_high: clip range above 1 (DAPO clip-higher, e.g. 0.28); None means clip_eps_low.
        tis_cap: truncated importance sampling cap C: when the trainer's old policy differs from the
            behaviour policy that generated the tokens, each token's loss is weighted by
            min(π_old/π_behaviour, C). None disables the correction.
        loss_agg: "token-mean" (every trained token in the batch weighs the same),
            "seq-mean-token-mean" (mean over each sequence, then over sequences) or
            "seq-mean-token-sum" (sum over each sequence, mean over sequences).
        seq_unit: what a "sequence" is for the seq-mean aggregations: "rollout" (all transitions of a
            rollout together, so per-call and merged transitions give the same loss) or "transition".
        kl_coef: weight of a KL penalty to the reference policy (0 disables; needs ref logprobs).
        kl_estimator: "k1" (log-ratio) or "k3" (the unbiased, always-positive estimator).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    clip_eps_low: float = Field(default=0.2, gt=0.0, lt=1.0)
    clip_eps_high: float | None = Field(default=None, gt=0.0, le=10.0)
    tis_cap: float | None = Field(default=2.0, ge=1.0)
    loss_agg: LossAggregation = "token-mean"
    seq_unit: Literal["rollout", "transition"] = "rollout"
    kl_coef: float = Field(default=0.0, ge=0.0)
    kl_estimator: Literal["k1", "k3"] = "k3"

    @property
    def eps_high(self) -> float:
        return self.clip_eps_low if self.clip_eps_high is None else self.clip_eps_high


class GRPO(PolicyLossConfig):
    """Group Relative Policy Optimisation: advantage = (return - group mean) / group std.

    Attributes:
        group_size: rollouts per task (≥ 2: a group of one has no baseline).
        scale_by_std: divide by the group's std; False is Dr. GRPO (no std scaling, less bias toward
            groups with small reward spread).
        std_eps: added to the std before dividing.
    """

    name: Literal["grpo"] = "grpo"
    group_size: int = Field(default=8, ge=2, le=1024)
    scale_by_std: bool = True
    std_eps: float = Field(default=1e-6, gt=0.0)

    @model_validator(mode="after")
    def _eps_only_with_std(self) -> GRPO:
        if not self.scale_by_std and "std_eps" in self.model_fields_set:
            raise ValueError("std_eps is only used with scale_by_std=True")
        return self


class RLOO(PolicyLossConfig):
    """REINFORCE Leave-One-Out: advantage = return - mean of the other rollouts' returns in the group.

    Attributes:
        group_size: rollouts per task (≥ 2: leave-one-out needs another rollout).
    """

    name: Literal["rloo"] = "rloo"
    group_size: int = Field(default=8, ge=2, le=1024)


class ReinforcePlusPlus(PolicyLossConfig):
    """REINFORCE++: returns minus an optional baseline, normalised over the whole batch.

    Attributes:
        group_size: rollouts per task (≥ 2 with baseline="group").
        baseline: "none" (plain batch normalisation, the original REINFORCE++) or "group" (subtract
            the group mean first: REINFORCE++-baseline).
        std_eps: added to the batch std before dividing.
    """

    name: Literal["reinforce_pp"] = "reinforce_pp"
    group_size: int = Field(default=1, ge=1, le=1024)
    baseline: Literal["none", "group"] = "none"
    std_eps: float = Field(default=1e-6, gt=0.0)

    @model_validator(mode="after")
    def _group_baseline(self) -> ReinforcePlusPlus:
        if self.baseline == "group" and self.group_size < 2:
            raise ValueError("baseline='group' needs group_size >= 2")
        return self


class PPO(PolicyLossConfig):
    """PPO with a value head and GAE over a rollout's transitions (one step per transition).

    Step rewards come from the transitions' credit sources: emitted and AIR credit where they
    happened, the final reward on the last transition; PPO discounts with its own `gamma`, so
    "discounted" credit is refused.

    Attributes:
        group_size: rollouts per task (PPO needs no groups; any value ≥ 1).
        gamma: discount per transition.
        lam: GAE λ (1 = Monte-Carlo returns, 0 = one-step TD).
        normalize_advantages: normalise advantages over the batch's transitions.
        vf_coef: weight of the value loss in the trainer's total loss.
        value_clip: clip the value prediction to old ± value_clip (None disables).
    """

    name: Literal["ppo"] = "ppo"
    group_size: int = Field(default=1, ge=1, le=1024)
    gamma: float = Field(default=1.0, gt=0.0, le=1.0)
    lam: float = Field(default=0.95, ge=0.0, le=1.0)
    normalize_advantages: bool = True
    vf_coef: float = Field(default=0.5, gt=0.0)
    value_clip: float | None = Field(default=0.2, gt=0.0)


Algorithm = GRPO | RLOO | ReinforcePlusPlus | PPO
_ALGORITHM_ADAPTER: TypeAdapter[Algorithm] = TypeAdapter(Annotated[Algorithm, Field(discriminator="name")])


def algorithm_from_dict(data: dict[str, Any]) -> Algorithm:
    """Build an algorithm config from plain data, e.g. a TOML table: {"name": "grpo", "group_size": 8}."""
    try:
        return _ALGORITHM_ADAPTER.validate_python(data)
    except ValidationError as exc:
        raise InvalidRequestError(f"invalid algorithm config: {exc}") from exc
