"""reinforge: train any AI agent with reinforcement learning, with (almost) no change to its code."""

from typing import TYPE_CHECKING

from reinforge._lazy import lazy_names
from reinforge.errors import (
    AuthenticationError,
    ConflictError,
    InvalidRequestError,
    NotFoundError,
    PayloadTooLargeError,
    ReinforgeError,
    StaleAttemptError,
    StoreUnavailableError,
)
from reinforge.runner import LLM, Agent, CommandAgent, Runner, agent, gateway_http_client
from reinforge.tracing import emit_reward, span
from reinforge.types import (
    Attempt,
    AttemptOutcome,
    AttemptStatus,
    LeasedRollout,
    ResourcesVersion,
    Rollout,
    RolloutMode,
    RolloutSpec,
    RolloutStatus,
    Span,
)

__version__ = "0.1.0"

# Training pulls in torch and transformers (seconds to import). Runners, agents and the store server
# don't need them, so these names load on first use.
_LAZY = {
    "Trainer": "reinforge.training",
    "TrainerConfig": "reinforge.training",
    "GRPO": "reinforge.algorithms",
    "RLOO": "reinforge.algorithms",
    "ReinforcePlusPlus": "reinforge.algorithms",
    "PPO": "reinforge.algorithms",
    "CreditConfig": "reinforge.credit",
}

__getattr__ = lazy_names(__name__, _LAZY)


if TYPE_CHECKING:
    from reinforge.algorithms import GRPO, PPO, RLOO, ReinforcePlusPlus
    from reinforge.credit import CreditConfig
    from reinforge.training import Trainer, TrainerConfig

__all__ = [
    "GRPO",
    "LLM",
    "PPO",
    "RLOO",
    "Agent",
    "Attempt",
    "AttemptOutcome",
    "AttemptStatus",
    "AuthenticationError",
    "CommandAgent",
    "ConflictError",
    "CreditConfig",
    "InvalidRequestError",
    "LeasedRollout",
    "NotFoundError",
    "PayloadTooLargeError",
    "ReinforcePlusPlus",
    "ReinforgeError",
    "ResourcesVersion",
    "Rollout",
    "RolloutMode",
    "RolloutSpec",
    "RolloutStatus",
    "Runner",
    "Span",
    "StaleAttemptError",
    "StoreUnavailableError",
    "Trainer",
    "TrainerConfig",
    "__version__",
    "agent",
    "emit_reward",
    "gateway_http_client",
    "span",
]
