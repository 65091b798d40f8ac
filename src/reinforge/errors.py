"""One exception hierarchy for the whole package; each class maps to one HTTP status."""

from __future__ import annotations


class ReinforgeError(Exception):
    """Base of every error reinforge raises on purpose."""

    http_status: int = 500


class InvalidRequestError(ReinforgeError, ValueError):
    """The caller's input is wrong (bad value, bad combination of options)."""

    http_status = 400


class AuthenticationError(ReinforgeError):
    """A missing or wrong bearer token."""

    http_status = 401


class NotFoundError(ReinforgeError, KeyError):
    """An id that the store does not know."""

    http_status = 404

    def __str__(self) -> str:  # KeyError quotes its message; we want it plain.
        return str(self.args[0]) if self.args else "not found"


class ConflictError(ReinforgeError):
    """The request contradicts the current state (a resources version reused with other content...)."""

    http_status = 409


class StaleAttemptError(ConflictError):
    """An attempt that is no longer the rollout's current one tried to report; nothing was counted."""


class PayloadTooLargeError(ReinforgeError):
    http_status = 413


class StoreUnavailableError(ReinforgeError):
    """The store could not be reached (network down, server gone); the call may be retried."""

    http_status = 503


class UpstreamError(ReinforgeError):
    """The upstream server failed or answered in a shape we can't read token ids from."""

    http_status = 502


class PromptTooLongError(InvalidRequestError):
    """The prompt does not fit the served model's context (a 400). The gateway words it as each API
    does, so agents' own handling fires: OpenAI's `context_length_exceeded` (litellm's
    `ContextWindowExceededError`), Anthropic's "prompt is too long: N tokens > M maximum"."""

    code = "context_length_exceeded"
    param = "messages"

    def __init__(self, prompt_tokens: int, limit: int) -> None:
        super().__init__(
            f"This model's maximum context length is {limit} tokens. However, your messages resulted "
            f"in {prompt_tokens} tokens. Please reduce the length of the messages."
        )
        self.prompt_tokens = prompt_tokens
        self.limit = limit

    def __reduce__(self) -> tuple[type[PromptTooLongError], tuple[int, int]]:
        # Crosses the engine's process boundary by pickle.
        return (type(self), (self.prompt_tokens, self.limit))

    @property
    def anthropic_message(self) -> str:
        return f"prompt is too long: {self.prompt_tokens} tokens > {self.limit} maximum"
