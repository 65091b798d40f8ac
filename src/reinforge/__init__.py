"""reinforge: train any AI agent with reinforcement learning, with (almost) no change to its code."""

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
from reinforge.runner import LLM, Agent, CommandAgent, Runner, agent
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

__all__ = [
    "LLM",
    "Agent",
    "Attempt",
    "AttemptOutcome",
    "AttemptStatus",
    "AuthenticationError",
    "CommandAgent",
    "ConflictError",
    "InvalidRequestError",
    "LeasedRollout",
    "NotFoundError",
    "PayloadTooLargeError",
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
    "__version__",
    "agent",
    "emit_reward",
    "span",
]
