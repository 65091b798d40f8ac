"""Errors the engine raises on purpose (bad requests use `reinforge.errors.InvalidRequestError`)."""

from __future__ import annotations

from reinforge.errors import ReinforgeError


class EngineError(ReinforgeError):
    """The engine failed while running a request (the model raised); the request may be retried."""

    http_status = 503


class EngineStoppedError(EngineError):
    """The engine was stopped before (or while) serving the request; start it again or use another."""


class UnsupportedArchitectureError(ReinforgeError, ValueError):
    """The model is outside the engine's fast path; the message names the family or part it lacks."""
