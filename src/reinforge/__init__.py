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
    "Attempt",
    "AttemptOutcome",
    "AttemptStatus",
    "AuthenticationError",
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
    "Span",
    "StaleAttemptError",
    "StoreUnavailableError",
    "__version__",
]
