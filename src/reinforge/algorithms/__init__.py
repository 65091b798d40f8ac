"""reinforge.algorithms: advantage estimators, the clipped policy-gradient loss, PPO's critic.

result = compute_advantages(transitions, GRPO(group_size=8))      # fills .advantage
scales = loss_scales(transitions, algorithm)                       # once per batch
loss, metrics = policy_loss(logprobs, behaviour, advantages, mask, algorithm, scales=scales_mb)
"""

from reinforge.algorithms.advantages import AdvantageResult, compute_advantages
from reinforge.algorithms.batch import TokenBatch, collate_transitions
from reinforge.algorithms.config import (
    GRPO,
    PPO,
    RLOO,
    Algorithm,
    LossAggregation,
    PolicyLossConfig,
    ReinforcePlusPlus,
    algorithm_from_dict,
)
from reinforge.algorithms.logprobs import TokenLogprobs, compute_token_logprobs
from reinforge.algorithms.loss import kl_penalty, loss_scales, policy_loss
from reinforge.algorithms.value import ValueHead, gae, value_loss

__all__ = [
    "GRPO",
    "PPO",
    "RLOO",
    "AdvantageResult",
    "Algorithm",
    "LossAggregation",
    "PolicyLossConfig",
    "ReinforcePlusPlus",
    "TokenBatch",
    "TokenLogprobs",
    "ValueHead",
    "algorithm_from_dict",
    "collate_transitions",
    "compute_advantages",
    "compute_token_logprobs",
    "gae",
    "kl_penalty",
    "loss_scales",
    "policy_loss",
    "value_loss",
]
