from __future__ import annotations

import pytest
from pydantic import ValidationError

from reinforge.algorithms import GRPO, PPO, RLOO, ReinforcePlusPlus, algorithm_from_dict
from reinforge.errors import InvalidRequestError


def test_defaults() -> None:
    grpo = GRPO()
    assert (grpo.group_size, grpo.scale_by_std, grpo.clip_eps_low, grpo.eps_high) == (8, True, 0.2, 0.2)
    assert (grpo.loss_agg, grpo.seq_unit, grpo.tis_cap, grpo.kl_coef) == ("token-mean", "rollout", 2.0, 0.0)
    assert GRPO(clip_eps_high=0.28).eps_high == 0.28
    assert PPO().lam == 0.95 and PPO().group_size == 1


@pytest.mark.parametrize(
    ("factory", "kwargs", "message"),
    [
        (GRPO, {"lam": 0.95}, "Extra inputs"),  # GRPO has no GAE
        (RLOO, {"scale_by_std": False}, "Extra inputs"),
        (PPO, {"baseline": "group"}, "Extra inputs"),
        (GRPO, {"group_size": 1}, "greater than or equal to 2"),
        (RLOO, {"group_size": 1}, "greater than or equal to 2"),
        (ReinforcePlusPlus, {"baseline": "group"}, "group_size >= 2"),
        (GRPO, {"scale_by_std": False, "std_eps": 1e-3}, "only used with scale_by_std"),
        (GRPO, {"clip_eps_low": 1.5}, "less than 1"),
        (GRPO, {"tis_cap": 0.5}, "greater than or equal to 1"),
        (GRPO, {"loss_agg": "sum"}, "token-mean"),
        (PPO, {"lam": 1.5}, "less than or equal to 1"),
    ],
)
def test_options_an_algorithm_cannot_honour_are_errors(
    factory: type, kwargs: dict[str, object], message: str
) -> None:
    with pytest.raises(ValidationError, match=message):
        factory(**kwargs)


def test_configs_are_immutable() -> None:
    with pytest.raises(ValidationError):
        GRPO().group_size = 4  # type: ignore[misc]


def test_algorithm_from_dict_picks_the_class_by_name() -> None:
    assert algorithm_from_dict({"name": "grpo", "group_size": 4}) == GRPO(group_size=4)
    assert isinstance(algorithm_from_dict({"name": "rloo"}), RLOO)
    assert (
        algorithm_from_dict({"name": "reinforce_pp", "baseline": "group", "group_size": 4}).baseline
        == "group"
    )
    assert algorithm_from_dict({"name": "ppo", "lam": 0.9}) == PPO(lam=0.9)
    with pytest.raises(InvalidRequestError, match="invalid algorithm config"):
        algorithm_from_dict({"name": "dpo"})
    with pytest.raises(InvalidRequestError, match="lam"):
        algorithm_from_dict({"name": "grpo", "lam": 0.9})
