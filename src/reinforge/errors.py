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
