"""Errors of model sources: each names the model or file and what is wrong with it."""

from __future__ import annotations

from reinforge.errors import InvalidRequestError


class ModelSourceError(InvalidRequestError):
    """A model that cannot be turned into a Hugging Face folder: an unreadable GGUF, an architecture
    transformers can't load or the engine can't serve, a conversion whose weights don't match."""


class ModelPackageMissingError(ModelSourceError):
    """A packaged model whose pip package is not installed (the message names the extra)."""
