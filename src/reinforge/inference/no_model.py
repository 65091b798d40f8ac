"""A backend with no model behind it: a served gateway still finishes attempts and takes rewards and
traces, and its LLM calls answer 503 with how to give it a model instead of a 404 for a missing route.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from reinforge.errors import ReinforgeError
from reinforge.inference.contract import GenerationRequest, GenerationResult, TextDelta, token_id_texts


class NoModelError(ReinforgeError):
    """This gateway serves no model."""

    http_status = 503


class NoModelBackend:
    """Refuses every generation with `hint` (what to start the server with to give it a model)."""

    def __init__(self, model_name: str, hint: str) -> None:
        self.model_name = model_name
        self.hint = hint

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        raise NoModelError(self.hint)

    async def stream(self, request: GenerationRequest) -> AsyncIterator[TextDelta | GenerationResult]:
        raise NoModelError(self.hint)
        yield  # pragma: no cover  (makes this an async generator, as the contract has it)

    def token_texts(self, ids: list[int]) -> list[str]:
        return token_id_texts(ids)
